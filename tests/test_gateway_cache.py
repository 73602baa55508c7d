"""End-to-end through a real gateway on loopback with the real Piper voice and a real diskcache."""

from __future__ import annotations

import asyncio
import hashlib
import io
from typing import Any

import soundfile as sf

from cache.disk import DiskTier
from gateway.http import keys
from gateway.runtime.settings import Settings
from metrics import Metrics
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, shortest_audio_s

SENTENCE = "The quick brown fox jumps over the lazy dog."


def body(**kw: Any) -> dict[str, Any]:
    base = {"model": "tts-1", "input": SENTENCE, "voice": "alloy", "response_format": "wav"}
    base.update(kw)
    return base


async def test_miss_then_hit_byte_identical(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    r1 = await client.post("/v1/audio/speech", json=body())
    assert r1.status == 200
    assert r1.headers["X-Cache"] == "MISS"
    a1 = await r1.read()
    r2 = await client.post("/v1/audio/speech", json=body())
    assert r2.headers["X-Cache"] == "HIT"
    assert await r2.read() == a1
    assert r1.headers["X-Audio-Key"] == r2.headers["X-Audio-Key"]
    assert r2.headers["ETag"] == r1.headers["ETag"] == f'"{hashlib.sha256(a1).hexdigest()[:32]}"'
    assert int(r2.headers["Content-Length"]) == len(a1)
    assert r2.headers["Content-Type"] == "audio/wav"
    assert counting_engine.items == 1


async def test_whitespace_and_nfc_variants_hit(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    text = "Caf\u00e9 opens at nine."
    r1 = await client.post("/v1/audio/speech", json=body(input=text))
    assert r1.headers["X-Cache"] == "MISS"
    variant = "  Cafe\u0301   opens\tat\n nine.  "  # NFD e + combining acute, odd whitespace
    r2 = await client.post("/v1/audio/speech", json=body(input=variant))
    assert r2.headers["X-Cache"] == "HIT"
    assert await r2.read() == await r1.read()
    assert counting_engine.items == 1


async def test_changed_parameters_change_the_key(gateway: GatewayFactory) -> None:
    client = await gateway()
    base = await client.post("/v1/audio/speech", json=body())
    keys = {base.headers["X-Audio-Key"]}
    for change in (
        {"input": SENTENCE.lower()},
        {"input": SENTENCE.rstrip(".") + "!"},
        {"speed": 1.25},
        {"response_format": "flac"},
        {"sample_rate": 16000},
        {"response_format": "pcm"},
    ):
        r = await client.post("/v1/audio/speech", json=body(**change))
        assert r.status == 200, await r.text()
        assert r.headers["X-Cache"] in ("MISS", "HIT")
        keys.add(r.headers["X-Audio-Key"])
    assert len(keys) == 7


async def test_model_change_changes_the_key(
    gateway: GatewayFactory, tmp_path: Any, settings: Settings, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    r1 = await client.post("/v1/audio/speech", json=body())
    counting_engine.fingerprint = "0" * 64  # as if the weights changed
    client2 = await gateway(metrics=Metrics())
    r2 = await client2.post("/v1/audio/speech", json=body())
    assert r2.headers["X-Cache"] == "MISS"
    assert r1.headers["X-Audio-Key"] != r2.headers["X-Audio-Key"]


async def test_fifty_concurrent_identical_misses_synthesize_once(
    gateway: GatewayFactory, counting_engine: CountingEngine, metrics: Metrics
) -> None:
    client = await gateway()
    counting_engine.delay_s = 0.3  # keep the first synthesis in flight while the rest arrive
    payload = body(input="Fifty callers ask for this sentence at once.")
    responses = await asyncio.gather(
        *(client.post("/v1/audio/speech", json=payload) for _ in range(50))
    )
    bodies = [await r.read() for r in responses]
    assert all(r.status == 200 for r in responses)
    assert len(set(bodies)) == 1
    assert counting_engine.items == 1
    caches = sorted(r.headers["X-Cache"] for r in responses)
    assert caches.count("MISS") == 1
    assert caches.count("COALESCED") + caches.count("HIT") == 49
    ok = metrics.registry.get_sample_value(
        "voxgate_syntheses_total", {"model": "piper", "outcome": "ok"}
    )
    assert ok == 1.0


async def test_wav_and_flac_decode_at_voice_rate(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    for fmt in ("wav", "flac"):
        r = await client.post("/v1/audio/speech", json=body(response_format=fmt))
        assert r.status == 200
        data, rate = sf.read(io.BytesIO(await r.read()))
        assert rate == counting_engine.sample_rate == 22050
        assert len(data) / rate >= shortest_audio_s(SENTENCE)


async def test_corrupted_disk_entry_is_never_served(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine, metrics: Metrics
) -> None:
    # No memory tier, so every read goes to disk.
    client = await gateway(settings=settings.replace(memory_cache_mb=0))
    payload = body(input="This entry will rot on disk.")
    first = await client.post("/v1/audio/speech", json=payload)
    good = await first.read()
    disk = client.app[keys.STORE].tiers[-1]
    assert isinstance(disk, DiskTier)
    await client.app[keys.STORE].drain()
    flipped = 0
    for key in await asyncio.to_thread(lambda: list(disk.iter_keys_sync())):
        path = await asyncio.to_thread(disk.path_of, key)
        assert path is not None, "entries over 32 KB are stored as files"
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF  # flip bytes in the audio of both the rendition and master
        path.write_bytes(bytes(raw))
        flipped += 1
    assert flipped == 2
    again = await client.post("/v1/audio/speech", json=payload)
    assert again.status == 200
    assert again.headers["X-Cache"] == "MISS"  # re-synthesized, not served corrupt
    data, rate = sf.read(io.BytesIO(await again.read()))
    assert rate == 22050 and len(data) / rate >= shortest_audio_s(payload["input"])
    assert counting_engine.items == 2
    assert (
        metrics.registry.get_sample_value(
            "voxgate_cache_lookups_total", {"tier": "disk", "result": "corrupt"}
        )
        == 2.0
    )
    assert len(good) > 0
