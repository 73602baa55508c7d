"""The tiered store against a real diskcache in a temp dir."""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

import pytest
from wait_for2.impl import CancelledWithResultError

from cache.disk import DiskTier
from cache.entry import Entry
from cache.keys import master_key, normalize_text, rendition_key
from cache.memory import MemoryTier
from cache.store import TieredStore
from cache.tier import PurgeFilter, TierError, bounded
from metrics import Metrics
from tests.support import small_file_system, wav_entry


async def open_disk(path: Path) -> DiskTier:
    # diskcache opens SQLite in its constructor: build it off the loop, as the app does.
    return await asyncio.to_thread(DiskTier, path, 100_000_000)


# The joe voice's, unless a test names another.
entry = functools.partial(wav_entry, voice="joe")


def test_normalization_keeps_case_and_punctuation() -> None:
    assert normalize_text("  a\u0301  b\n") == "\u00e1 b"
    assert normalize_text("Hello.") != normalize_text("hello.")
    assert normalize_text("Hello.") != normalize_text("Hello!")


def test_keys_differ_by_every_field() -> None:
    base = dict(text="hi", engine="piper", voice="joe", fingerprint="f", params={"speed": 1.0})
    k = master_key(**base)  # type: ignore[arg-type]
    for field, value in (
        ("text", "Hi"),
        ("engine", "coqui"),
        ("voice", "amy"),
        ("fingerprint", "g"),
        ("params", {"speed": 1.5}),
    ):
        assert master_key(**{**base, field: value}) != k  # type: ignore[arg-type]
    assert rendition_key(k, fmt="wav", sample_rate=8000) != rendition_key(
        k, fmt="wav", sample_rate=16000
    )
    assert len(k) == 64


def disk_lookups(m: Metrics, result: str) -> float | None:
    """How many lookups the disk tier answered with ``result`` (hit, miss, corrupt)."""
    return m.registry.get_sample_value(
        "voxgate_cache_lookups_total", {"tier": "disk", "result": result}
    )


async def stored_on_disk(store: TieredStore, disk: DiskTier, key: str) -> Path:
    """Put a 100 KB entry (a file of its own) under ``key``; the file that holds it."""
    await store.put(key, entry(bytes(range(256)) * 400))
    path = await asyncio.to_thread(disk.path_of, key)
    assert path is not None
    return path


async def test_read_promotes_from_disk_to_memory(tmp_path: Path) -> None:
    m = Metrics()
    memory, disk = MemoryTier(10_000_000), await open_disk(tmp_path)
    store = TieredStore([memory, disk], m)
    await disk.put("k" * 64, entry(b"x" * 50_000))
    found = await store.get("k" * 64)
    assert found is not None and found.tier == "disk"
    assert memory.get_nowait("k" * 64) is not None
    assert disk_lookups(m, "hit") == 1.0
    await store.close()


async def test_corrupt_disk_entry_is_a_counted_miss_and_deleted(tmp_path: Path) -> None:
    m = Metrics()
    disk = await open_disk(tmp_path)
    store = TieredStore([disk], m)
    key = "a" * 64
    path = await stored_on_disk(store, disk, key)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert await store.get(key) is None
    assert disk_lookups(m, "corrupt") == 1.0
    assert await disk.get(key) is None  # deleted
    await store.close()


async def test_memory_lru_is_byte_bounded_and_keeps_pinned() -> None:
    evicted: list[int] = []
    mem = MemoryTier(1000, on_evict=evicted.append)
    await mem.put("pinned", entry(b"p" * 400, pinned=True))
    for i in range(5):
        await mem.put(f"k{i}", entry(b"x" * 300))
    stats = await mem.stats()
    assert stats.bytes <= 1000
    assert mem.get_nowait("pinned") is not None
    assert mem.get_nowait("k4") is not None and mem.get_nowait("k0") is None
    assert sum(evicted) == 3


@pytest.mark.parametrize("pinned_filter", [None, False])
async def test_purge_by_voice_across_tiers(tmp_path: Path, pinned_filter: bool | None) -> None:
    store = TieredStore([MemoryTier(10_000_000), await open_disk(tmp_path)], Metrics())
    await store.put("1" * 64, entry(b"a" * 100, voice="joe"))
    await store.put("2" * 64, entry(b"b" * 100, voice="amy"))
    await store.put("3" * 64, entry(b"c" * 100, voice="joe", pinned=True))
    removed = await store.purge(PurgeFilter(voice="joe", pinned=pinned_filter))
    expected = 2 if pinned_filter is None else 1
    assert removed == {"memory": expected, "disk": expected}
    assert await store.get("2" * 64) is not None
    assert (await store.get("3" * 64) is None) == (pinned_filter is None)
    assert await store.get("1" * 64) is None
    await store.close()


async def test_purge_older_than(tmp_path: Path) -> None:
    store = TieredStore([await open_disk(tmp_path)], Metrics())
    await store.put("1" * 64, entry(b"a" * 100))
    cutoff = time.time() + 1
    assert await store.purge(PurgeFilter(older_than=cutoff - 3600)) == {"disk": 0}
    assert await store.purge(PurgeFilter(older_than=cutoff)) == {"disk": 1}
    await store.close()


def test_checksums_are_crc32c_and_legacy_blake2b_entries_still_verify() -> None:
    import hashlib
    from dataclasses import replace

    from cache.entry import CorruptEntry

    audio = b"RIFF" + bytes(range(256)) * 40
    fresh = Entry.create(audio, content_type="audio/wav", fmt="wav", sample_rate=22050)
    assert fresh.meta.checksum.startswith("crc32c:")
    fresh.verify()
    legacy = replace(
        fresh, meta=replace(fresh.meta, checksum=hashlib.blake2b(audio, digest_size=16).hexdigest())
    )
    assert Entry.from_blob(legacy.to_blob()).audio == audio  # written before CRC-32C
    for e in (fresh, legacy):
        bad = bytearray(e.to_blob())
        bad[-1] ^= 0x10
        with pytest.raises(CorruptEntry):
            Entry.from_blob(bytes(bad))


class _Plant:
    """Unpickling this creates the file ``marker``: the stand-in for a planted shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("side", ["lru", "pinned"])
@pytest.mark.parametrize("min_file_size", [0, 1 << 15])  # the pickle in its own file, in the row
async def test_a_planted_pickle_row_is_never_unpickled(
    tmp_path: Path, side: str, min_file_size: int
) -> None:
    """A pickle-mode row (value, and key) planted in the cache directory is a
    counted miss and is deleted; reading, listing and purging never run it."""
    import diskcache

    marker = tmp_path / "pwned"
    m = Metrics()
    disk = await open_disk(tmp_path / "cache")
    store = TieredStore([disk], m)
    key = "c" * 64

    def plant() -> None:
        # diskcache's own Disk, as an attacker with write access to the directory would use.
        with diskcache.Cache(
            str(tmp_path / "cache" / side), disk_min_file_size=min_file_size
        ) as foreign:
            foreign.set(key, _Plant(marker))  # value pickled
            foreign.set(_Plant(marker), b"x")  # key pickled
        assert not marker.exists()  # planting it ran nothing

    await asyncio.to_thread(plant)
    assert await store.get(key) is None
    assert not marker.exists()
    assert disk_lookups(m, "corrupt") == 1.0
    keys = await asyncio.to_thread(lambda: list(disk.iter_keys_sync()))
    assert key not in keys  # deleted by the store
    assert await store.purge(PurgeFilter()) == {"disk": 0}
    assert not marker.exists()
    await store.put(key, entry(b"real audio" * 10))  # the key works again
    found = await store.get(key)
    assert found is not None and found.entry.audio == b"real audio" * 10
    await store.close()


async def test_a_value_that_is_not_bytes_is_a_counted_miss(tmp_path: Path) -> None:
    import diskcache

    m = Metrics()
    disk = await open_disk(tmp_path)
    store = TieredStore([disk], m)
    await asyncio.to_thread(lambda: diskcache.Cache(str(tmp_path / "lru")).set("d" * 64, 42))
    assert await store.get("d" * 64) is None
    assert disk_lookups(m, "corrupt") == 1.0
    await store.close()


async def test_a_flipped_metadata_byte_is_caught(tmp_path: Path) -> None:
    """The disk frame's checksum covers the metadata too: a content type rotted on disk is a
    corrupt entry, not a different Content-Type served."""
    m = Metrics()
    disk = await open_disk(tmp_path)
    store = TieredStore([disk], m)
    key = "e" * 64
    path = await stored_on_disk(store, disk, key)
    raw = path.read_bytes()
    at = raw.index(b"audio/wav")
    path.write_bytes(raw[:at] + b"audio/wax" + raw[at + 9 :])
    assert await store.get(key) is None
    assert disk_lookups(m, "corrupt") == 1.0
    await store.close()


async def test_an_entry_written_before_the_frame_is_still_read(tmp_path: Path) -> None:
    """Upgrading keeps the disk tier: an unframed blob (the old layout) is read, its audio
    checksum verified."""
    disk = await open_disk(tmp_path)
    old = entry(b"old audio" * 50)
    await asyncio.to_thread(disk._cache.set, "f" * 64, old.to_blob())
    got = await disk.get("f" * 64)
    assert got is not None and got.audio == old.audio and got.meta == old.meta
    await disk.close()


def test_the_blob_head_is_the_metadata_as_dataclasses_writes_it() -> None:
    """The blob's metadata is built by hand (asdict deep-copied every tuple), and must stay the
    JSON it was: entries already stored, and replicas of the version before, read it."""
    import dataclasses
    import json
    import struct

    full = Entry.create(
        b"abc",
        content_type="audio/wav",
        fmt="wav",
        sample_rate=22050,
        model="piper",
        voice="joe",
        pinned=True,
        duration_s=3.25,
        master="a" * 64,
        parts=("b" * 64, "c" * 64),
        pause_ms=250,
        gaps_ms=(0, 250, 0),
        trims=(False, True, False),
    )
    for e in (full, entry(b"x")):
        fields = dataclasses.asdict(e.meta)
        for name in ("gaps_ms", "trims", "alignment", "marks", "marks_checksum"):
            if not fields[name]:
                del fields[name]
        meta = json.dumps(fields, separators=(",", ":")).encode()
        assert e.to_blob() == struct.pack(">I", len(meta)) + meta + e.audio
        assert Entry.from_blob(e.to_blob()) == e


async def test_a_large_value_is_one_file_holding_the_framed_entry(tmp_path: Path) -> None:
    """A value of its own file (past diskcache's min_file_size) is written in one piece, and the
    file holds exactly the frame: magic, CRC-32C, then the blob."""
    from crc32c import crc32c

    disk = await open_disk(tmp_path)
    big = entry(bytes(range(256)) * 600)  # 150 KB, a 0x0A byte every 256
    await disk.put("e" * 64, big)
    path = await asyncio.to_thread(disk.path_of, "e" * 64)
    assert path is not None
    data = await asyncio.to_thread(path.read_bytes)
    blob = big.to_blob()
    assert data == b"VXD1" + crc32c(blob).to_bytes(4, "big") + blob
    got = await disk.get("e" * 64)
    assert got == big
    await disk.close()


async def test_the_cache_directory_is_private(tmp_path: Path) -> None:
    """Created 0700 (whoever can write a row there decides what is served); an existing one
    writable by others is tightened."""
    disk = await open_disk(tmp_path / "new" / "cache")
    for path in (tmp_path / "new" / "cache", tmp_path / "new" / "cache" / "lru"):
        assert path.stat().st_mode & 0o777 == 0o700, path
    await disk.close()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    disk = await open_disk(shared)
    assert shared.stat().st_mode & 0o777 == 0o700
    await disk.close()


# ---- bounded(): a tier call's timeout ---------------------------------------------------------


async def _cancelled_with_result(waiting: asyncio.Event | None = None) -> None:
    """Waits; cancelled, it raises what wait_for2 raises when a cancellation races a completion."""
    if waiting is not None:
        waiting.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise CancelledWithResultError(None, False) from None


async def test_a_timeout_meeting_a_cancelled_subclass_is_a_timeout() -> None:
    """wait_for2 (pipecat's asyncio.wait_for on Python < 3.12, used by redis-py then) answers
    our timeout's cancellation with CancelledWithResultError; it must read as the timeout, as
    Python 3.12's asyncio.timeout would have it, not cancel the request (a clean-clone failure
    of test_two_replicas_produce_once[cluster])."""
    with pytest.raises(TimeoutError):
        await bounded(_cancelled_with_result(), 0.01)


async def test_a_real_cancellation_through_bounded_stays_a_cancellation() -> None:
    waiting = asyncio.Event()
    task = asyncio.ensure_future(bounded(_cancelled_with_result(waiting), 30))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_full_disk_evicts_the_oldest_entries_to_store_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = small_file_system(monkeypatch, tmp_path, 550_000)
    evicted: list[int] = []
    disk = await asyncio.to_thread(
        functools.partial(DiskTier, tmp_path, 100_000_000, on_evict=evicted.append)
    )
    try:
        keys = [f"{i:064x}" for i in range(8)]
        for key in keys:  # five fit; the disk is full long before the tier's bound
            await disk.put(key, entry(b"x" * 100_000))
        assert all([await disk.get(k) for k in keys[-3:]])
        assert await disk.get(keys[0]) is None
        stats = await disk.stats()
        assert stats.evicted_for_space == sum(evicted) >= 3 and stats.full is False
        # No partial file of a failed write is left taking the room.
        assert len(files()) == stats.entries
        # Room taken by something else that eviction cannot free: not stored, and said so.
        pinned = entry(b"p" * 100_000, pinned=True)
        await disk.put("f" * 64, pinned)
        (tmp_path / "hog.val").write_bytes(bytes(550_000))
        with pytest.raises(TierError, match="No space left"):
            await disk.put("e" * 64, entry(b"y" * 100_000))
        stats = await disk.stats()
        assert stats.full is True and await disk.get("f" * 64) is not None  # pinned: kept
        (tmp_path / "hog.val").unlink()
        await disk.put("e" * 64, entry(b"y" * 100_000))
        assert (await disk.stats()).full is False
    finally:
        await disk.close()
