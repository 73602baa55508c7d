"""Nothing in a cache tier decides what is served unless
voxgate wrote it. Planted and replayed Redis values, hostile metadata, oversized replies, pinned
flags from below, masters that do not decode and squatted locks, against a real redis-server and
a real gateway on loopback."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sqlite3
import struct
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import diskcache
import numpy as np
import pytest
from limits import RateLimitItemPerMinute
from redis.asyncio import Redis

from bench.harness import CACHE_SECRET, RedisServer
from cache.disk import DiskTier, frame
from cache.distributed import CrossReplicaFlight
from cache.entry import CorruptEntry, Entry, ForgedEntry
from cache.memory import MemoryTier
from cache.redis_tier import EntrySeal, RedisTier
from cache.store import TieredStore
from cache.tier import PurgeFilter
from gateway.http import keys
from gateway.runtime.apikeys import key_table
from gateway.runtime.settings import Settings
from metrics import Metrics
from synth.engine import Audio, Engine, SynthesisItem
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.redis_support import adopted, must_not_produce, nothing_stored
from tests.support import SECRET, CountingEngine, clear_of_a_minute_edge, until, wav_entry

KEY = "ab" * 32
OTHER = "cd" * 32
MIB = 1024 * 1024


def blob_with_meta(meta: dict[str, Any], audio: bytes = b"x" * 10) -> bytes:
    raw = json.dumps(meta).encode()
    return struct.pack(">I", len(raw)) + raw + audio


@pytest.fixture
async def tier(redis: RedisServer) -> AsyncIterator[RedisTier]:
    t = await asyncio.to_thread(
        RedisTier.from_url, redis.url, secret=SECRET, timeout_s=5.0, metrics=Metrics()
    )
    yield t
    await t.close()


def forged_values() -> list[bytes]:
    """What someone who can write to Redis, without the cache secret, might plant."""
    html = b"<script>alert(document.domain)</script>"
    meta = {"content_type": "text/html", "format": "wav", "sample_rate": 22050, "checksum": ""}
    blob = blob_with_meta(meta, html)
    return [
        html,  # raw bytes
        blob,  # an unframed blob
        b"VXR2" + struct.pack(">I", 0) + blob,  # an old CRC frame, CRC wrong
        struct.pack(">4sI", b"VXR1", zlib.crc32(blob)) + blob,  # an old frame, CRC right
        b"VXR3" + b"\0" * 32 + wav_entry().to_blob(),  # the new frame, a made-up tag
    ]


@pytest.mark.parametrize("which", range(5))
async def test_a_planted_value_is_never_served(tier: RedisTier, which: int) -> None:
    metrics = Metrics()
    store = TieredStore([tier], metrics)
    await tier.client.set(tier.entry_key(KEY), forged_values()[which])
    assert await store.get(KEY) is None
    forged = metrics.registry.get_sample_value(
        "voxgate_cache_lookups_total", {"tier": "redis", "result": "forged"}
    )
    corrupt = metrics.registry.get_sample_value(
        "voxgate_cache_lookups_total", {"tier": "redis", "result": "corrupt"}
    )
    assert (forged or 0) + (corrupt or 0) == 1
    assert await tier.client.exists(tier.entry_key(KEY)) == 0  # deleted


async def test_a_value_moved_to_another_key_is_refused(tier: RedisTier) -> None:
    """The tag covers the key: a genuine value replayed under another address is a forgery."""
    stored = wav_entry()
    await tier.put(KEY, stored)
    genuine = await tier.client.get(tier.entry_key(KEY))
    await tier.client.set(tier.entry_key(OTHER), genuine)
    assert await tier.get(KEY) == stored
    with pytest.raises(ForgedEntry):
        await tier.get(OTHER)


async def test_another_secret_cannot_write_values_this_one_reads(redis: RedisServer) -> None:
    other = RedisTier.from_url(redis.url, secret=b"another-secret-of-32-characters!", timeout_s=5.0)
    mine = RedisTier.from_url(redis.url, secret=SECRET, timeout_s=5.0)
    try:
        await other.put(KEY, wav_entry())
        with pytest.raises(ForgedEntry):
            await mine.get(KEY)
    finally:
        await other.close()
        await mine.close()


@pytest.mark.parametrize(
    "bad",
    [
        {"content_type": ["text/html"]},
        {"format": "<script>"},
        {"sample_rate": 10**400},
        {"sample_rate": "22050"},
        {"sample_rate": True},
        {"voice": "v" * 100_000},
        {"pinned": "yes"},
        {"created": float("nan")},
        {"parts": ["ab" * 32] * 5000},
        {"parts": [{"k": 1}]},
        {"master": "../../etc/passwd"},
        {"unknown_field": 1},
    ],
)
def test_metadata_types_and_sizes_are_checked_on_read(bad: dict[str, Any]) -> None:
    meta = {"content_type": "audio/wav", "format": "wav", "sample_rate": 22050, "checksum": ""}
    with pytest.raises(CorruptEntry):
        Entry.from_blob(blob_with_meta({**meta, **bad}), verify=False)
    Entry.from_blob(blob_with_meta(meta), verify=False)  # the same without it reads


@pytest.mark.parametrize("lean", [True, False])
async def test_a_value_over_the_entry_bound_is_refused(redis: RedisServer, lean: bool) -> None:
    """``redis_max_entry_mb`` holds on reads; the lean reader refuses before it allocates."""
    t = RedisTier.from_url(
        redis.url, secret=SECRET, max_entry_bytes=MIB, lean_reads=lean, timeout_s=5.0
    )
    try:
        await t.put(KEY, wav_entry(b"s" * 1000))
        await t.client.set(t.entry_key(OTHER), b"VXR3" + b"\0" * (3 * MIB))
        tracemalloc.start()
        try:
            with pytest.raises(CorruptEntry, match=r"over redis_max_entry_mb|larger than"):
                await t.get(OTHER)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        if lean:
            assert peak < MIB, peak  # never a buffer of the declared size
        # The connection is still in step: the next GET on it answers.
        got = await t.get(KEY)
        assert got is not None and got.audio == b"s" * 1000
    finally:
        await t.close()


async def test_pinned_from_below_never_passes_an_upper_bound(
    tier: RedisTier, tmp_path: Any
) -> None:
    """An 8 MiB entry flagged pinned in Redis once entered a 1 MiB memory tier on promotion."""
    memory = MemoryTier(MIB)
    disk = await asyncio.to_thread(DiskTier, tmp_path / "disk", 2 * MIB)
    store = TieredStore([memory, disk, tier], Metrics())
    tier.max_entry_bytes = 16 * MIB
    big = wav_entry(b"p" * (8 * MIB), pinned=True)
    await tier.put(KEY, big)
    found = await store.get(KEY)
    assert found is not None and found.tier == "redis" and found.entry.audio == big.audio
    await store.drain()
    assert (await memory.stats()).bytes <= MIB
    assert memory.get_nowait(KEY) is None
    assert (await disk.stats()).pinned == 0  # over the disk's pinned quota: stored evictable
    small = wav_entry(b"q" * 1000, pinned=True)
    await store.put(OTHER, small)  # a pinned entry within the bounds is kept, and pinned
    assert memory.get_nowait(OTHER) == small
    assert (await disk.stats()).pinned == 1
    await disk.close()


async def test_a_squatted_lock_does_not_stall_a_miss(tier: RedisTier) -> None:
    """A lock key no replica wrote (no TTL, or a value without a valid tag) is removed at the
    first poll and taken, where a miss once waited ``redis_lock_wait_s`` behind it."""
    metrics = Metrics()
    flight = CrossReplicaFlight(tier, lock_ttl_s=30, max_wait_s=30, metrics=metrics)
    made: list[str] = []

    async def produce() -> str:
        made.append("here")
        return "made"

    squats = [
        ("junk", None),  # a value, no TTL
        ("junk", 20_000),  # a value with a TTL
        (tier.seal.lock_token(flight.lock_key(KEY), 30), None),  # a real token, no TTL
        (tier.seal.lock_token(flight.lock_key(OTHER), 30), 20_000),  # another key's token
        ("a" * 32 + ".\u00e9", 20_000),  # a tag not ASCII (compare_digest refuses such a str)
        (b"a" * 32 + b".\xff", 20_000),  # not even UTF-8
    ]
    loop = asyncio.get_running_loop()
    for value, px in squats:
        made.clear()
        await tier.client.set(flight.lock_key(KEY), value, px=px)
        started = loop.time()
        assert await flight.run(KEY, produce, adopted) == "made"
        assert loop.time() - started < 5  # one poll, not the 30 s wait
        assert made == ["here"]
    assert metrics.redis_locks.labels("squatted")._value.get() == len(squats)
    assert await tier.client.exists(flight.lock_key(KEY)) == 0  # released after


async def test_a_replicas_lock_is_still_waited_for(tier: RedisTier) -> None:
    """A genuine lock (a valid token and a TTL within lock_ttl_s) is not taken as a squat."""
    metrics = Metrics()
    holder = CrossReplicaFlight(tier, lock_ttl_s=5, metrics=Metrics())
    waiter = CrossReplicaFlight(tier, lock_ttl_s=5, max_wait_s=20, metrics=metrics)
    release = asyncio.Event()

    started = asyncio.Event()

    async def produce_when_released() -> str:
        started.set()  # the holder has the lock now
        await release.wait()
        await tier.put(KEY, wav_entry())
        return "holder"

    held = asyncio.ensure_future(holder.run(KEY, produce_when_released, adopted))
    await started.wait()
    waiting = asyncio.ensure_future(waiter.run(KEY, must_not_produce, adopted))
    await asyncio.sleep(0.3)  # several polls: it keeps waiting
    assert not waiting.done()
    release.set()
    assert await held == "holder"
    assert await waiting == "adopted"
    assert metrics.redis_locks.labels("squatted")._value.get() == 0


# The captured lock's TTL: short, so that a replay can wait it out, yet long enough that the
# value is still there when read right after the lock is taken (at 0.2 s a loop stall of
# 0.2 s between the two lost it).
CAPTURED_TTL_S = 1.0


async def capture_a_lock_value(tier: RedisTier) -> bytes:
    """A genuine lock value, as someone watching Redis would capture it from a replica's work
    (its lock lived CAPTURED_TTL_S)."""
    holder = CrossReplicaFlight(tier, lock_ttl_s=CAPTURED_TTL_S)

    async def produce() -> bytes:
        value = await tier.client.get(holder.lock_key(KEY))
        assert isinstance(value, bytes)
        return value

    return await holder.run(KEY, produce, nothing_stored)


@pytest.mark.parametrize("forgery", ["replayed", "expiry moved on", "another secret"])
async def test_a_replayed_or_forged_lock_value_does_not_stall_a_miss(
    tier: RedisTier, forgery: str
) -> None:
    """A lock value captured from a replica and written back after its expiry passed was a
    valid lock: a miss waited ``redis_lock_wait_s`` behind it. The expiry is now under the
    value's HMAC: an expired value, one whose expiry was moved on, or one made without the
    cache secret is no replica's lock, removed at the first poll and taken."""
    metrics = Metrics()
    flight = CrossReplicaFlight(tier, lock_ttl_s=30, max_wait_s=3, metrics=metrics)
    name = flight.lock_key(KEY)
    captured_at = time.time()
    captured = await capture_a_lock_value(tier)
    if forgery == "replayed":
        # It was made at most CAPTURED_TTL_S (its lock's TTL) before it expires.
        await until(
            lambda: time.time() > captured_at + CAPTURED_TTL_S + 0.05,
            30,
            "the captured value's expiry",
        )
        planted = captured
    elif forgery == "expiry moved on":
        nonce, _, tag = captured.split(b".")
        planted = b".".join([nonce, str(int(time.time() + 3600) * 1000).encode(), tag])
    else:
        planted = EntrySeal(b"another-secret-of-32-characters!").lock_token(name, 30).encode()
    await tier.client.set(name, planted, px=20_000)  # a TTL a real lock could have

    async def produce() -> str:
        return "made"

    assert await flight.run(KEY, produce, nothing_stored) == "made"
    assert metrics.redis_lock_waits.labels("takeover")._value.get() == 1
    assert metrics.redis_lock_waits.labels("timeout")._value.get() == 0  # not stalled
    assert metrics.redis_locks.labels("squatted")._value.get() == 1
    assert await tier.client.exists(name) == 0  # released after


async def test_a_holder_past_its_first_expiry_keeps_its_lock(tier: RedisTier) -> None:
    """A holder working longer than its lock's TTL renews it with a new value (a new expiry
    under the tag): a waiter never takes a live holder's lock for an expired one. The keeper
    renews every third of the 1.5 s TTL: losing the lock by chance needs a loop stall of a
    second (0.2 s did it with a 0.3 s TTL)."""
    holder = CrossReplicaFlight(tier, lock_ttl_s=1.5)
    waiter_metrics = Metrics()
    waiter = CrossReplicaFlight(tier, lock_ttl_s=1.5, max_wait_s=30, metrics=waiter_metrics)
    name = holder.lock_key(KEY)
    working, release = asyncio.Event(), asyncio.Event()

    async def produce() -> str:
        working.set()
        await release.wait()
        await tier.put(KEY, wav_entry())
        return "holder"

    held = asyncio.ensure_future(holder.run(KEY, produce, adopted))
    await working.wait()
    first = await tier.client.get(name)
    assert isinstance(first, bytes)
    first_expiry = tier.seal.lock_token_expiry(name, first)
    assert first_expiry is not None
    waiting = asyncio.ensure_future(waiter.run(KEY, must_not_produce, adopted))
    try:
        # Well past the first value's expiry: renewed (a new value), still the holder's.
        await until(lambda: time.time() > first_expiry + 0.5, 30, "the first value's expiry")
        now = await tier.client.get(name)
        assert isinstance(now, bytes) and now != first
        renewed = tier.seal.lock_token_expiry(name, now)
        assert renewed is not None and renewed > time.time()
        assert not waiting.done()
    finally:
        release.set()
    assert await held == "holder"
    assert await waiting == "adopted"
    assert waiter_metrics.redis_locks.labels("squatted")._value.get() == 0
    assert waiter_metrics.redis_lock_waits.labels("takeover")._value.get() == 0


# ---- rate-limit counters ------------------------------------------------------------------

LIMITED_SECRET = canary("limited")


async def counter_names(client: Redis) -> list[bytes]:
    return sorted([name async for name in client.scan_iter(match="voxgate:ratelimit*")])


async def test_a_counter_planted_under_a_keys_name_locks_nothing(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path, redis: RedisServer
) -> None:
    """A rate-limit counter written to Redis under a key's name (``r:<name>``, what anyone who
    knows the name and can write Redis could compute) once locked that key out for good. Now
    the counters are named by an HMAC under the cache secret: the planted one counts for no
    key, the key's own budget still holds, and no counter name in Redis holds a key's name."""
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(key_table("ivr-prod", LIMITED_SECRET, ["speak"], requests_per_minute=3))
    client = await gateway(
        settings=settings.replace(
            api_keys_file=str(keys_file), redis_url=redis.url, cache_secret=CACHE_SECRET
        )
    )
    attacker = Redis.from_url(redis.url)
    try:
        plain = RateLimitItemPerMinute(3).key_for("r:ivr-prod")
        await attacker.set(f"voxgate:ratelimit:{{{plain}}}", 10**6)  # no TTL: for good
        headers = {"X-API-Key": LIMITED_SECRET}
        await clear_of_a_minute_edge()
        statuses = [(await client.get("/v1/models", headers=headers)).status for _ in range(4)]
        assert statuses == [200, 200, 200, 429]  # its own budget, shared in Redis, holds
        names = await counter_names(attacker)
        assert len(names) == 2  # the planted one and the key's own
        assert [name for name in names if b"ivr-prod" in name] == [
            f"voxgate:ratelimit:{{{plain}}}".encode()
        ]
    finally:
        await attacker.aclose()


@pytest.mark.parametrize("planted", ["over the limit", "no TTL", "a longer TTL"])
async def test_a_counter_no_replica_could_write_is_discarded(
    gateway: GatewayFactory,
    settings: Settings,
    metrics: Metrics,
    tmp_path: Path,
    redis: RedisServer,
    planted: str,
) -> None:
    """Someone who can write Redis finds the counters in use by a scan (not whose they are)
    and rewrites them. A count past the limit or a TTL the library never sets once locked the
    key out for as long as the counter lived (for good without a TTL): the refusal it causes
    now deletes it, counts it, and the key's budget starts again."""
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(key_table("ivr-prod", LIMITED_SECRET, ["speak"], requests_per_minute=3))
    client = await gateway(
        settings=settings.replace(
            api_keys_file=str(keys_file), redis_url=redis.url, cache_secret=CACHE_SECRET
        )
    )
    headers = {"X-API-Key": LIMITED_SECRET}
    attacker = Redis.from_url(redis.url)
    await clear_of_a_minute_edge()
    try:
        assert (await client.get("/v1/models", headers=headers)).status == 200
        names = await counter_names(attacker)
        assert names  # what the scan finds
        count, px = {
            "over the limit": (10**6, 60_000),
            "no TTL": (3, None),
            "a longer TTL": (3, 3_600_000),
        }[planted]
        for name in names:
            await attacker.set(name, count, px=px)
        statuses = [(await client.get("/v1/models", headers=headers)).status for _ in range(4)]
        assert statuses == [200, 200, 200, 429]  # the budget starts again, and holds
        count_of = metrics.registry.get_sample_value
        assert count_of("voxgate_rate_limit_counters_discarded_total") == 1
        assert count_of("voxgate_rate_limit_fallbacks_total") == 0
    finally:
        await attacker.aclose()


# ---- through the gateway ------------------------------------------------------------------


def speech(text: str, fmt: str = "wav") -> dict[str, Any]:
    return {"model": "tts-1", "input": text, "voice": "alloy", "response_format": fmt}


async def test_a_planted_value_under_a_served_key_is_never_sent(
    gateway: GatewayFactory, settings: Settings, redis: RedisServer
) -> None:
    """Replica A synthesizes a text; a value planted under its key (a script, as
    HTML) is served by replica B (no local tiers: everything from Redis) neither by
    ``GET /v1/audio/{key}`` nor by the speech endpoint."""
    shared = settings.replace(redis_url=redis.url, cache_secret=CACHE_SECRET)
    a = await gateway(settings=shared)
    b_metrics = Metrics()
    b = await gateway(
        settings=shared.replace(memory_cache_mb=0, disk_cache_mb=0, cache_dir=settings.cache_dir),
        metrics=b_metrics,
    )
    made = await a.post("/v1/audio/speech", json=speech("Thank you for calling."))
    assert made.status == 200
    key, audio = made.headers["X-Audio-Key"], await made.read()
    tier = a.app[keys.STORE].tiers[-1]
    assert isinstance(tier, RedisTier)
    for value in forged_values():
        await tier.client.set(tier.entry_key(key), value)
        got = await b.get(f"/v1/audio/{key}")
        assert got.status == 404
        assert b"script" not in await got.read()
        await tier.client.set(tier.entry_key(key), value)
        spoken = await b.post("/v1/audio/speech", json=speech("Thank you for calling."))
        assert spoken.status == 200 and spoken.content_type == "audio/wav"
        assert (await spoken.read())[:4] == b"RIFF" == audio[:4]  # audio B made anew
    forged = b_metrics.registry.get_sample_value(
        "voxgate_cache_lookups_total", {"tier": "redis", "result": "forged"}
    )
    assert forged is not None and forged >= 6


async def test_content_type_comes_from_the_stored_format(gateway: GatewayFactory) -> None:
    """Even an entry voxgate itself holds is served with its format's type, never the stored
    content_type text."""
    client = await gateway()
    store = client.app[keys.STORE]
    entry = Entry.create(
        b"RIFF....WAVE", content_type="text/html", fmt="wav", sample_rate=22050, model="piper"
    )
    await store.put(KEY, entry)
    got = await client.get(f"/v1/audio/{KEY}")
    assert got.status == 200
    assert got.headers["Content-Type"] == "audio/wav"
    odd = Entry.create(b"<b>", content_type="text/html", fmt="html", sample_rate=22050)
    await store.put(OTHER, odd)
    assert (await client.get(f"/v1/audio/{OTHER}")).status == 404  # unknown format: deleted
    assert await store.get(OTHER) is None


async def test_a_master_that_does_not_decode_is_synthesized_again(
    gateway: GatewayFactory, counting_engine: CountingEngine, metrics: Metrics
) -> None:
    """A master that passes its checksum but is no audio once made every new format of its
    sentence a 500: now it is deleted and synthesized anew."""
    client = await gateway()
    store = client.app[keys.STORE]
    text = "Your call is important to us."
    first = await client.post("/v1/audio/speech", json=speech(text))
    assert first.status == 200
    rendition = await store.get(first.headers["X-Audio-Key"])
    assert rendition is not None
    (master_key,) = rendition.entry.meta.parts
    garbage = Entry.create(b"not flac at all", content_type="audio/flac", fmt="flac", sample_rate=1)
    await store.put(master_key, garbage)
    before = counting_engine.items
    again = await client.post("/v1/audio/speech", json=speech(text, "mp3"))
    assert again.status == 200 and again.content_type == "audio/mpeg"
    assert len(await again.read()) > 1000
    assert counting_engine.items == before + 1  # synthesized once more
    master = await store.get(master_key)
    assert master is not None and master.entry.audio != garbage.audio
    corrupt = sum(
        s.value
        for s in metrics.cache_lookups.collect()[0].samples
        if s.labels.get("result") == "corrupt" and s.name.endswith("_total")
    )
    assert corrupt >= 1
    # The telephony path (another encoding of the stored rendition) copes too.
    await store.put(master_key, garbage)
    key = first.headers["X-Audio-Key"]
    ulaw = await client.get(f"/v1/audio/{key}.ulaw")
    assert ulaw.status < 500


class ReplicaVoice(CountingEngine):
    """The real voice, its samples moved by the replica's number: other bytes for one address,
    as a provider may send (or ONNX Runtime on another CPU may make: the local engines' noise
    is drawn from the address, tests/test_one_sound.py)."""

    def __init__(self, inner: Engine, replica: int) -> None:
        super().__init__(inner)
        self.replica = replica

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        moved = np.float32(self.replica / 1000)
        return [replace(a, pcm=a.pcm + moved) for a in super().synthesize_batch(items)]


async def test_two_replicas_without_a_shared_store_never_send_one_etag_for_two_bodies(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine, tmp_path: Any
) -> None:
    """Two replicas without a shared store may make different bytes for one content address
    (a provider's, another CPU's); they once sent the same strong ETag (the key) with
    ``immutable`` for both. The ETag now names the bytes: one ETag, one body."""
    replicas = [
        await gateway(
            settings=settings.replace(cache_dir=str(tmp_path / f"replica{i}")),
            engines={"piper": ReplicaVoice(counting_engine.inner, i)},
        )
        for i in range(2)
    ]
    bodies_by_etag: dict[str, set[bytes]] = {}
    keys_seen: set[str] = set()
    for text in ("Press one for sales.", "Press two for support.", "Please hold the line."):
        for client in replicas:
            for _ in range(2):  # a miss, then a hit
                r = await client.post("/v1/audio/speech", json=speech(text))
                assert r.status == 200
                bodies_by_etag.setdefault(r.headers["ETag"], set()).add(await r.read())
                keys_seen.add(r.headers["X-Audio-Key"])
            by_key = await client.get(f"/v1/audio/{r.headers['X-Audio-Key']}")
            assert "immutable" not in by_key.headers["Cache-Control"]
            bodies_by_etag.setdefault(by_key.headers["ETag"], set()).add(await by_key.read())
    assert len(keys_seen) == 3  # one content address per text, on both replicas
    assert all(len(bodies) == 1 for bodies in bodies_by_etag.values())
    # The replicas did make different bytes for some address (else this proves nothing).
    assert len(bodies_by_etag) > 3


@pytest.mark.parametrize("stream", [False, True])
async def test_waiting_for_another_replicas_synthesis_says_coalesced(
    gateway: GatewayFactory,
    settings: Settings,
    redis: RedisServer,
    counting_engine: CountingEngine,
    tmp_path: Any,
    stream: bool,
) -> None:
    """Replica B asks for a text replica A is synthesizing: B waits on A's lock, adopts A's
    master and says COALESCED (it said MISS: one MISS per replica in a herd), streamed or not."""
    shared = settings.replace(redis_url=redis.url, cache_secret=CACHE_SECRET)
    a_metrics, b_metrics = Metrics(), Metrics()
    a = await gateway(settings=shared.replace(cache_dir=str(tmp_path / "a")), metrics=a_metrics)
    b = await gateway(settings=shared.replace(cache_dir=str(tmp_path / "b")), metrics=b_metrics)
    text = "Please hold while we connect your call."
    before = counting_engine.items
    counting_engine.release.clear()  # A's synthesis waits in the engine
    try:
        first = asyncio.ensure_future(a.post("/v1/audio/speech", json=speech(text)))
        await until(
            lambda: a_metrics.redis_locks.labels("acquired")._value.get() >= 1, 20, "A's lock"
        )
        second = asyncio.ensure_future(
            b.post("/v1/audio/speech", json={**speech(text), "stream": stream})
        )
        await until(
            lambda: b_metrics.redis_locks.labels("contended")._value.get() >= 1, 20, "B waiting"
        )
    finally:
        counting_engine.release.set()
    ra, rb = await first, await second
    assert (ra.status, rb.status) == (200, 200)
    assert ra.headers["X-Cache"] == "MISS"
    assert rb.headers["X-Cache"] == "COALESCED"
    body_b = await rb.read()
    assert len(body_b) > 1000
    assert counting_engine.items == before + 1  # one synthesis, on A


# ---- disk rows ----------------------------------------------------------------------------


def plant_row(cache_dir: Path, key: str, filename: str) -> None:
    """A row of the disk tier's bounded side naming ``filename`` as its value file, written
    straight into diskcache's SQLite, as whoever can write the cache directory could."""
    with closing(sqlite3.connect(cache_dir / "lru" / "cache.db")) as db, db:
        db.execute(
            "INSERT OR REPLACE INTO Cache (key, raw, store_time, expire_time, access_time,"
            " access_count, tag, size, mode, filename, value)"
            " VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, ?, ?, NULL)",
            (key, time.time(), time.time(), diskcache.core.MODE_BINARY, filename),
        )


def disk_lookups(metrics: Metrics, result: str) -> float:
    got = metrics.registry.get_sample_value(
        "voxgate_cache_lookups_total", {"tier": "disk", "result": result}
    )
    return got or 0.0


async def open_disk(path: Path, *, timeout_s: float = 2.0) -> DiskTier:
    return await asyncio.to_thread(DiskTier, path, 64 * MIB, timeout_s=timeout_s)


@pytest.mark.parametrize(
    "name", ["../../victim/value.val", "ab/../../../victim/value.val", "{victim}/value.val"]
)
async def test_a_disk_row_naming_a_file_outside_the_cache_deletes_nothing_there(
    tmp_path: Path, name: str
) -> None:
    """A planted row whose value file is ``../../x`` (or an absolute path) once made the
    clean-up of the corrupt row delete that file, and its folder, outside the cache directory.
    Now it is a corrupt row that touches no file outside: on a read, and on a purge."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "value.val").write_bytes(b"an operator's file, not a cache value")
    filename = name.format(victim=victim)
    metrics = Metrics()
    disk = await open_disk(tmp_path / "cache")
    store = TieredStore([disk], metrics)
    (tmp_path / "cache" / "lru" / "ab").mkdir()  # so that "ab/.." resolves
    try:
        plant_row(tmp_path / "cache", KEY, filename)
        assert await store.get(KEY) is None
        assert (victim / "value.val").exists()
        assert disk_lookups(metrics, "corrupt") == 1
        assert KEY not in await asyncio.to_thread(lambda: list(disk.iter_keys_sync()))
        plant_row(tmp_path / "cache", KEY, filename)
        assert await store.purge(PurgeFilter()) == {"disk": 1}  # the row goes, the file stays
        assert (victim / "value.val").read_bytes() == b"an operator's file, not a cache value"
        assert sorted(await asyncio.to_thread(os.listdir, tmp_path)) == ["cache", "victim"]
    finally:
        await store.close()


@pytest.mark.parametrize("link", ["file", "folder"])
async def test_a_disk_row_reaching_out_through_a_link_is_refused(tmp_path: Path, link: str) -> None:
    """A value file (or a folder on its way) that is a symbolic link out of the cache directory
    is never read, even when what it points to is a well-formed value: it was once served."""
    victim = tmp_path / "victim"
    victim.mkdir()
    outside = victim / "value.val"
    planted = frame(wav_entry(b"audio planted outside" * 2000))
    outside.write_bytes(planted)
    metrics = Metrics()
    disk = await open_disk(tmp_path / "cache")
    store = TieredStore([disk], metrics)
    lru = tmp_path / "cache" / "lru"
    if link == "file":
        (lru / "zz" / "zz").mkdir(parents=True)
        (lru / "zz" / "zz" / "link.val").symlink_to(outside)
        filename = "zz/zz/link.val"
    else:
        (lru / "zz").symlink_to(victim, target_is_directory=True)
        filename = "zz/value.val"
    try:
        plant_row(tmp_path / "cache", KEY, filename)
        assert await store.get(KEY) is None
        assert disk_lookups(metrics, "corrupt") == 1
        assert outside.read_bytes() == planted
        if link == "file":  # the link itself is deleted with its row, never its target
            assert not (lru / "zz" / "zz" / "link.val").is_symlink()
    finally:
        await store.close()


async def test_a_disk_row_naming_a_fifo_is_a_miss_that_never_blocks(tmp_path: Path) -> None:
    """A row naming a FIFO once blocked a disk thread in open() until a writer came: a few such
    rows wedged every thread, and the tier then answered nothing. Now each is a corrupt row,
    answered at once, and the tier still serves after more of them than it has threads."""
    metrics = Metrics()
    disk = await open_disk(tmp_path / "cache", timeout_s=1.0)
    store = TieredStore([disk], metrics)
    fifos = tmp_path / "cache" / "lru" / "ff"
    fifos.mkdir(parents=True)
    planted = [f"{i:02x}" * 32 for i in range(6)]  # more than the tier's 4 threads
    for i, key in enumerate(planted):
        os.mkfifo(fifos / f"{i}.val")
        plant_row(tmp_path / "cache", key, f"ff/{i}.val")
    try:
        async with asyncio.timeout(30):
            for key in planted:
                assert await store.get(key) is None
            assert disk_lookups(metrics, "corrupt") == len(planted)
            assert disk_lookups(metrics, "error") == 0  # none timed out
            real = wav_entry(b"real audio" * 5000)
            await store.put(OTHER, real)
            found = await store.get(OTHER)
            assert found is not None and found.entry.audio == real.audio
    finally:
        # A reader still blocked in open() (the failure this test looks for) is let go, so the
        # tier's threads can be joined.
        for fifo in fifos.glob("*.val"):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader waits on it
                    raise
        await store.close()
