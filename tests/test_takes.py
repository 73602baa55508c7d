"""Every new take passes one seam before it is stored: :func:`gateway.speech.takes.accept_take`.

The checks of a take's audio live there (synth/takecheck.py); a path that wrote a master or a
rendition into the store any other way would store (and later serve as a HIT) audio nobody
checked. A refused take is taken again, then refused to the caller, and never stored.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import soundfile as sf

from cache.entry import Entry
from cache.store import TieredStore
from gateway.runtime.settings import Settings
from gateway.speech import takes
from metrics import Metrics
from synth.upstream import UpstreamConfig
from tests.conftest import GatewayFactory
from tests.support import CountingEngine
from tests.upstream_support import KEY_ENV, RATE, OpenAISpeechServer, voiced


@pytest.fixture
def puts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, bool]]]:
    """Every store put while the test runs: (key, format, whether it came through the seam)."""
    seen: list[tuple[str, str, bool]] = []
    put = TieredStore.put
    seam = takes.accept_take.__code__

    async def watched(self: TieredStore, key: str, entry: Entry) -> None:
        frame = sys._getframe(1)
        through = False
        while frame is not None and not through:
            through = frame.f_code is seam
            frame = frame.f_back
        seen.append((key, entry.meta.format, through))
        await put(self, key, entry)

    monkeypatch.setattr(TieredStore, "put", watched)
    yield seen


async def test_a_synthesis_a_stream_and_a_transcode_store_through_the_seam(
    gateway: GatewayFactory, puts: list[tuple[str, str, bool]]
) -> None:
    client = await gateway()
    whole = {"model": "tts-1", "voice": "alloy", "input": "Good morning.", "response_format": "wav"}
    r = await client.post("/v1/audio/speech", json=whole)
    assert r.status == 200 and r.headers["X-Cache"] == "MISS"
    key = r.headers["X-Audio-Key"]
    streamed = {**whole, "input": "Your order shipped. It arrives on Friday.", "stream": True}
    r = await client.post("/v1/audio/speech", json=streamed)
    assert r.status == 200 and r.headers["X-Cache"] == "MISS"
    await r.read()
    r = await client.get(f"/v1/audio/{key}.ulaw")
    assert r.status == 200
    await r.read()
    # Three masters (flac), two renditions (wav) and one transcode (ulaw), each once.
    formats = sorted(fmt for _, fmt, _ in puts)
    assert formats == ["flac", "flac", "flac", "ulaw", "wav", "wav"]
    assert [key for key, _, through in puts if not through] == []


def upstream(server: OpenAISpeechServer) -> UpstreamConfig:
    return UpstreamConfig.model_validate(
        {
            "name": "openai",
            "kind": "openai",
            "base_url": server.url,
            "api_key_env": KEY_ENV,
            "model": "gpt-4o-mini-tts",
            "voices": ["alloy"],
            "timeout_s": 5,
            "price_per_million_chars": 15.0,
        }
    )


def value(metrics: Metrics, name: str, **labels: str) -> float:
    metrics.flush_pending()
    return metrics.registry.get_sample_value(name, labels) or 0.0


TEXT = "Your order has shipped and will arrive on Friday."
ASK = {"model": "openai", "voice": "alloy", "input": TEXT, "response_format": "wav"}
SILENCE = np.zeros(2 * RATE, dtype="<i2")


async def test_a_provider_answering_silence_is_asked_once_per_take_then_502_and_nothing_kept(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    """The defaults (signal checks, two retakes): three calls, each billed, each take refused
    as silent; the caller gets a 502 naming the reason; nothing is stored, so the next request
    asks again."""
    client = await gateway(engines={"piper": counting_engine, "openai": upstream(provider)})
    provider.takes.extend([SILENCE] * 3)
    r = await client.post("/v1/audio/speech", json=ASK)
    assert r.status == 502
    error = (await r.json())["error"]
    assert error["code"] == "take_rejected" and "silent" in error["message"]
    assert provider.calls == 3
    rejected = value(
        metrics, "voxgate_takes_total", model="openai", verdict="rejected", reason="silent"
    )
    assert rejected == 3
    billed = value(metrics, "voxgate_upstream_chars_billed_total", upstream="openai")
    assert billed == 3 * len(TEXT)
    # Each refused take is kept aside for review, never under its address.
    kept = (await (await client.get("/v1/takes")).json())["takes"]
    assert len(kept) == 3
    assert all(t["reasons"] == ["silent"] and t["model"] == "openai" for t in kept)
    # Nothing was kept: the same request is a miss that calls again (a good take this time).
    r = await client.post("/v1/audio/speech", json=ASK)
    assert r.status == 200 and r.headers["X-Cache"] == "MISS" and provider.calls == 4
    r = await client.post("/v1/audio/speech", json=ASK)
    assert r.status == 200 and r.headers["X-Cache"] == "HIT" and provider.calls == 4


async def test_a_refused_take_is_taken_again_and_the_good_one_kept(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    client = await gateway(engines={"piper": counting_engine, "openai": upstream(provider)})
    cut = voiced(TEXT)[: len(voiced(TEXT)) // 3]  # a third of the take: cut off mid-word
    provider.takes.append(cut)
    r = await client.post("/v1/audio/speech", json=ASK)
    assert r.status == 200 and r.headers["X-Cache"] == "MISS"
    heard, rate = sf.read(io.BytesIO(await r.read()), dtype="int16")
    assert rate == RATE and heard.shape == voiced(TEXT).shape
    assert provider.calls == 2
    assert value(metrics, "voxgate_takes_total", model="openai", verdict="accepted", reason="") == 1
    assert (
        value(
            metrics, "voxgate_takes_total", model="openai", verdict="rejected", reason="too_short"
        )
        == 1
    )


async def test_with_checks_off_a_take_is_kept_as_it_came(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
    settings: Settings,
) -> None:
    off = settings.model_copy(update={"take_checks": "off"})
    client = await gateway(
        settings=off, engines={"piper": counting_engine, "openai": upstream(provider)}
    )
    provider.takes.append(SILENCE)
    r = await client.post("/v1/audio/speech", json=ASK)
    assert r.status == 200 and provider.calls == 1
    assert value(metrics, "voxgate_takes_total", model="openai", verdict="accepted", reason="") == 0


async def test_the_bundled_voice_s_takes_pass(
    gateway: GatewayFactory, metrics: Metrics, counting_engine: CountingEngine
) -> None:
    """Clean local takes of prompts of every length are accepted at the first try."""
    client = await gateway()
    texts = ["Hi.", "Good morning.", "Press one for sales, two for support.", TEXT]
    for text in texts:
        ask = {"model": "piper", "voice": "joe", "input": text, "response_format": "wav"}
        r = await client.post("/v1/audio/speech", json={**ask, "stream": False})
        assert r.status == 200, await r.text()
    assert counting_engine.items == len(texts)
    assert value(metrics, "voxgate_takes_total", model="piper", verdict="accepted", reason="") == 4
