"""The quarantine of refused takes: bounded in count and bytes, expiring, one list for every
process of the host; reviewed over HTTP by an admin only (list, listen, approve, discard)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache.entry import Entry
from gateway.http import keys
from gateway.runtime.apikeys import key_table
from gateway.runtime.settings import Settings
from gateway.speech.quarantine import Quarantine
from gateway.speech.takes import Take
from synth import audio
from synth.takecheck import Verdict
from tests.canary import canary
from tests.conftest import GatewayFactory

ADMIN_SECRET = canary("review-admin")
SPEAK_SECRET = canary("review-speak")
ADMIN = {"X-API-Key": ADMIN_SECRET}
SPEAK = {"X-API-Key": SPEAK_SECRET}
SILENT = Verdict(("silent", "too_short"), {"duration_s": 0.5, "expected_s": 2.0})


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def opened(path: Path, **options: Any) -> Quarantine:
    return await asyncio.to_thread(lambda: Quarantine(path, **options))


def take(seconds: float = 0.5, text: str = "Hello there.") -> tuple[Entry, Take]:
    # Quiet noise (seeded): sizes of a few KB a second, as a refused take's might be.
    pcm = np.random.default_rng(7).normal(0, 0.01, int(16000 * seconds)).astype(np.float32)
    stored, master = audio.master_of(pcm, 16000)
    entry = Entry.create(
        master, content_type="audio/flac", fmt="flac", sample_rate=16000, model="m", voice="v"
    )
    return entry, Take(stored, 16000, text, None)


async def keep(q: Quarantine, key: str, seconds: float = 0.5) -> str:
    entry, t = take(seconds)
    await q.keep(key, entry, t, SILENT)
    return next(r.id for r in await q.listing() if r.key == key)


async def test_kept_takes_carry_their_record_and_verified_audio(tmp_path: Path) -> None:
    q = await opened(tmp_path / "q", clock=Clock())
    id_ = await keep(q, "k1")
    (record,) = await q.listing()
    assert (record.key, record.model, record.voice, record.text) == ("k1", "m", "v", "Hello there.")
    assert record.reasons == ("silent", "too_short") and record.measured["expected_s"] == 2.0
    assert record.time == 1_000_000.0
    found = await q.get(id_)
    assert found is not None and audio.decode_master(found[1].audio)[1] == 16000
    # Another process of the host (another Quarantine on the directory) sees the same list.
    other = await opened(tmp_path / "q", clock=Clock())
    assert [r.id for r in await other.listing()] == [id_]
    assert await other.pop(id_) is not None and await q.pop(id_) is None  # taken once
    await other.close()
    await q.close()


async def test_the_oldest_go_first_past_the_count_and_the_bytes(tmp_path: Path) -> None:
    q = await opened(tmp_path / "q", max_takes=3, clock=Clock())
    for i in range(5):
        await keep(q, f"k{i}")
    assert [r.key for r in await q.listing()] == ["k2", "k3", "k4"]
    await q.close()
    size = len(take(1.0)[0].to_blob())
    q = await opened(tmp_path / "b", max_bytes=int(size * 2.5), clock=Clock())
    for i in range(4):
        await keep(q, f"b{i}", seconds=1.0)
    assert [r.key for r in await q.listing()] == ["b2", "b3"]
    entry, t = take(seconds=10.0)  # alone larger than the bound: not kept, nothing dropped
    await q.keep("huge", entry, t, SILENT)
    assert [r.key for r in await q.listing()] == ["b2", "b3"]
    await q.close()


async def test_takes_expire_after_their_time(tmp_path: Path) -> None:
    clock = Clock()
    q = await opened(tmp_path / "q", ttl_s=100.0, clock=clock)
    old = await keep(q, "old")
    clock.now += 60
    await keep(q, "new")
    clock.now += 50  # "old" is 110 s old, "new" 50 s
    assert [r.key for r in await q.listing()] == ["new"]
    assert await q.get(old) is None
    clock.now += 50
    assert await q.listing() == []
    await q.close()


async def test_a_tampered_take_is_dropped_not_served(tmp_path: Path) -> None:
    q = await opened(tmp_path / "q", clock=Clock())
    id_ = await keep(q, "k")

    def flip() -> None:
        blob = q._cache.get(id_)
        q._cache.set(id_, blob[:-1] + bytes([blob[-1] ^ 1]), tag=1_000_000.0)

    await asyncio.to_thread(flip)
    assert await q.get(id_) is None and await q.listing() == []
    await q.close()


@pytest.fixture
def keyed(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "keys.toml"
    path.write_text(
        key_table("ops", ADMIN_SECRET, ["admin"]) + key_table("ivr", SPEAK_SECRET, ["speak"])
    )
    return settings.replace(api_keys_file=str(path))


async def test_an_admin_lists_listens_approves_and_discards(
    gateway: GatewayFactory, keyed: Settings
) -> None:
    http = await gateway(settings=keyed)
    service = http.app[keys.SPEECH]
    q = service.rejects
    assert q is not None
    approve_id = await keep(q, "a" * 64)
    discard_id = await keep(q, "b" * 64)

    for path in ("/v1/takes", f"/v1/takes/{approve_id}/audio"):
        assert (await http.get(path, headers=SPEAK)).status == 403
        assert (await http.get(path)).status == 401
    refused = await http.post(f"/v1/takes/{approve_id}/approve", headers=SPEAK)
    assert refused.status == 403

    listed = (await (await http.get("/v1/takes", headers=ADMIN)).json())["takes"]
    assert [t["id"] for t in listed] == [approve_id, discard_id]
    assert listed[0]["text"] == "Hello there." and listed[0]["reasons"] == ["silent", "too_short"]
    heard = await http.get(f"/v1/takes/{approve_id}/audio", headers=ADMIN)
    assert heard.status == 200 and heard.content_type == "audio/flac"
    assert audio.decode_master(await heard.read())[0].size == 8000

    bad = await http.get("/v1/takes/NOT-AN-ID/audio", headers=ADMIN)
    assert bad.status == 400 and (await bad.json())["error"]["code"] == "invalid_take_id"
    gone = await http.post("/v1/takes/0123456789abcdef/discard", headers=ADMIN)
    assert gone.status == 404 and (await gone.json())["error"]["code"] == "take_not_found"

    assert await service.store.get("a" * 64) is None
    approved = await http.post(f"/v1/takes/{approve_id}/approve", headers=ADMIN)
    assert await approved.json() == {"id": approve_id, "key": "a" * 64, "outcome": "approved"}
    stored = await service.store.get("a" * 64)
    assert stored is not None and stored.entry.meta.content_type == "audio/flac"
    again = await http.post(f"/v1/takes/{approve_id}/approve", headers=ADMIN)
    assert again.status == 404

    dropped = await http.post(f"/v1/takes/{discard_id}/discard", headers=ADMIN)
    assert (await dropped.json())["outcome"] == "discarded"
    assert await service.store.get("b" * 64) is None
    assert (await (await http.get("/v1/takes", headers=ADMIN)).json())["takes"] == []
