"""Upstreams in one gateway process: the real ``openai`` SDK (voxgate's client of kind "openai")
against a local server that follows OpenAI's published speech contract
(:mod:`tests.upstream_support`, which cites the document), behind the gateway's store.

What a process boundary changes (replicas, the default topology's pool process, another voxgate
as the upstream) is tested against ``voxgate serve`` in tests/test_upstream_serve.py.
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import CACHE_SECRET, RedisServer, free_port
from gateway.http import keys
from gateway.runtime.settings import Settings
from metrics import Metrics
from synth.audio import as_rendered_pcm16
from synth.engine import SynthesisItem
from synth.providers.base import retry_after_of
from synth.providers.polly_api import aws_region
from synth.upstream import UpstreamConfig, UpstreamEngine, load_upstreams
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, until
from tests.upstream_support import (
    KEY_ENV,
    OPENAI_KEY,
    RATE,
    AzureServer,
    CartesiaServer,
    ContractServer,
    DeepgramServer,
    ElevenLabsServer,
    GoogleServer,
    HeldWyomingServer,
    OpenAISpeechServer,
    PollyServer,
    Scripted,
    voiced,
)

GREETING = "Thank you for calling."


def entry(server: OpenAISpeechServer, **kw: Any) -> UpstreamConfig:
    values: dict[str, Any] = {
        "name": "openai",
        "kind": "openai",
        "base_url": server.url,
        "api_key_env": KEY_ENV,
        "model": "gpt-4o-mini-tts",
        "voices": ["alloy", "nova"],
        "timeout_s": 5,
        "price_per_million_chars": 15.0,
    }
    values.update(kw)
    return UpstreamConfig.model_validate(values)


def speech(text: str = GREETING, **kw: Any) -> dict[str, Any]:
    body = {"model": "openai", "input": text, "voice": "alloy", "response_format": "wav"}
    body.update(kw)
    return body


async def start(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    *configs: UpstreamConfig,
    metrics: Metrics | None = None,
    settings: Settings | None = None,
) -> Any:
    engines: dict[str, Any] = {"piper": counting_engine, **{c.name: c for c in configs}}
    kw: dict[str, Any] = {"engines": engines}
    if metrics is not None:
        kw["metrics"] = metrics
    if settings is not None:
        kw["settings"] = settings
    return await gateway(**kw)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    metrics.flush_pending()
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_two_identical_requests_cost_one_call_and_a_second_format_none(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    client = await start(gateway, counting_engine, entry(provider), metrics=metrics)
    first = await client.post("/v1/audio/speech", json=speech())
    assert first.status == 200, await first.text()
    assert first.headers["X-Cache"] == "MISS"
    audio, rate = sf.read(io.BytesIO(await first.read()), dtype="int16")
    # The provider's audio, as it made it: the master is its pcm, kept at 16 bits (the
    # gateway's float round trip moves a sample by at most 2 steps of 65536).
    assert rate == RATE
    expected = voiced(GREETING)
    assert audio.shape == expected.shape
    assert np.max(np.abs(audio.astype(np.int32) - expected)) <= 2
    again = await client.post("/v1/audio/speech", json=speech())
    assert again.headers["X-Cache"] == "HIT"
    assert provider.calls == 1
    # Every other format, rate and telephony URL: transcodes of the stored master.
    for fmt in ("mp3", "flac", "pcm", "opus"):
        r = await client.post("/v1/audio/speech", json=speech(response_format=fmt))
        assert r.status == 200, await r.text()
    r = await client.post("/v1/audio/speech", json=speech(sample_rate=8000))
    assert r.status == 200 and r.headers["X-Audio-Sample-Rate"] == "8000"
    ulaw = await client.get(f"/v1/audio/{first.headers['X-Audio-Key']}.ulaw")
    assert ulaw.status == 200, await ulaw.text()
    assert provider.calls == 1
    # The call was OpenAI's request, as the document has it, asking for a lossless format.
    (sent,) = provider.bodies
    assert sent == {
        "model": "gpt-4o-mini-tts",
        "input": GREETING,
        "voice": "alloy",
        "response_format": "pcm",
    }
    assert provider.headers[0]["Authorization"] == f"Bearer {OPENAI_KEY}"
    # Billed once, the rest served from the store, and what that saved at 15 per million.
    n = len(GREETING)
    assert value(metrics, "voxgate_upstream_chars_billed_total", upstream="openai") == n
    assert value(metrics, "voxgate_upstream_calls_total", upstream="openai", result="ok") == 1
    cached = value(metrics, "voxgate_upstream_chars_cached_total", upstream="openai")
    assert cached == 6 * n  # the HIT, four formats, one rate (the .ulaw GET is by address)
    saved = value(metrics, "voxgate_upstream_saved_total", upstream="openai")
    assert saved == pytest.approx(cached * 15.0 / 1e6)


async def test_split_sentence_a_new_text_of_old_sentences_costs_nothing(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    client = await start(gateway, counting_engine, entry(provider), metrics=metrics)
    a, b = "Your call is important to us.", "Please stay on the line."
    for text in (a, b):
        r = await client.post("/v1/audio/speech", json=speech(text))
        assert r.status == 200
    assert provider.calls == 2
    r = await client.post("/v1/audio/speech", json=speech(f"{b} {a}"))
    # A new rendition, made of stored sentences (so it says HIT: nothing was synthesized).
    assert r.status == 200 and r.headers["X-Cache"] == "HIT"
    assert provider.calls == 2
    n = len(a) + len(b)
    assert value(metrics, "voxgate_upstream_chars_cached_total", upstream="openai") == n
    # One new sentence in a new text: only it is billed.
    r = await client.post("/v1/audio/speech", json=speech(f"{a} Goodbye now."))
    assert r.status == 200
    assert provider.texts == [a, b, "Goodbye now."]


async def test_split_whole_sends_each_text_in_one_call(
    gateway: GatewayFactory, counting_engine: CountingEngine, provider: OpenAISpeechServer
) -> None:
    client = await start(gateway, counting_engine, entry(provider, split="whole"))
    text = "Your call is important to us. Please stay on the line."
    r = await client.post("/v1/audio/speech", json=speech(text))
    assert r.status == 200
    assert provider.texts == [text]
    r = await client.post("/v1/audio/speech", json=speech("Please stay on the line."))
    assert r.status == 200
    assert provider.calls == 2  # no sentence of another text is reused


async def test_instructions_speed_voice_and_revision_are_in_the_address(
    gateway: GatewayFactory, counting_engine: CountingEngine, provider: OpenAISpeechServer
) -> None:
    client = await start(
        gateway,
        counting_engine,
        entry(provider),
        entry(provider, name="openai-r2", revision="2"),
    )
    seen = set()
    for body in (
        speech(),
        speech(instructions="Speak warmly."),
        speech(instructions="Speak briskly."),
        speech(speed=1.5),
        speech(voice="nova"),
        speech(model="openai-r2"),
    ):
        r = await client.post("/v1/audio/speech", json=body)
        assert r.status == 200, await r.text()
        assert r.headers["X-Cache"] == "MISS"
        assert "X-Ignored-Fields" not in r.headers
        seen.add(r.headers["X-Audio-Key"])
    assert len(seen) == 6 and provider.calls == 6
    assert provider.bodies[1]["instructions"] == "Speak warmly."
    assert provider.bodies[3]["speed"] == 1.5


async def test_a_provider_429_with_retry_after_is_retried_and_succeeds(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    client = await start(gateway, counting_engine, entry(provider), metrics=metrics)
    provider.script.append(Scripted(429, "Rate limit reached", {"Retry-After": "1"}))
    started = time.monotonic()
    r = await client.post("/v1/audio/speech", json=speech())
    assert r.status == 200, await r.text()
    # The retry waited what the provider asked (a lower bound: no chance in it).
    assert time.monotonic() - started >= 1.0
    assert provider.calls == 2 and provider.texts == [GREETING]
    assert (
        value(metrics, "voxgate_upstream_calls_total", upstream="openai", result="rate_limited")
        == 1
    )
    assert (
        value(metrics, "voxgate_upstream_retries_total", upstream="openai", kind="rate_limited")
        == 1
    )
    assert value(metrics, "voxgate_upstream_chars_billed_total", upstream="openai") == len(GREETING)


async def test_5xx_is_retried_and_a_refusal_is_the_callers_400_with_the_providers_message(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    client = await start(gateway, counting_engine, entry(provider, voices=["*"]), metrics=metrics)
    provider.script.append(Scripted(500, "The server had an error", {"Retry-After": "0"}))
    r = await client.post("/v1/audio/speech", json=speech())
    assert r.status == 200 and provider.calls == 2
    # "*": any voice id goes to the provider, which refuses one it lacks.
    r = await client.post("/v1/audio/speech", json=speech(voice="marin"))
    assert r.status == 400
    err = (await r.json())["error"]
    assert "upstream 'openai' refused the request" in err["message"]
    assert "Invalid value for 'voice' = marin" in err["message"]
    assert err["code"] == "upstream_refused"
    assert provider.calls == 3  # not retried
    assert value(metrics, "voxgate_upstream_errors_total", upstream="openai", kind="refused") == 1
    # A voice id that cannot be one is refused before it costs a call.
    r = await client.post("/v1/audio/speech", json=speech(voice="no such voice!"))
    assert r.status == 400 and provider.calls == 3


async def test_a_listed_voice_list_is_enforced_never_swapped_and_listed(
    gateway: GatewayFactory, counting_engine: CountingEngine, provider: OpenAISpeechServer
) -> None:
    client = await start(gateway, counting_engine, entry(provider))
    # "coral" is an OpenAI voice alias (of joe, here) this upstream does not list: refused,
    # not answered in another of its voices.
    r = await client.post("/v1/audio/speech", json=speech(voice="coral"))
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["code"] == "voice_not_found"
    # Only what this model takes is offered: not OpenAI's aliases of a voice it lacks, which
    # would be refused in turn.
    assert err["message"].endswith("for model 'openai'; available: alloy, nova"), err
    assert provider.calls == 0
    voices = await (await client.get("/v1/voices")).json()
    (listed,) = [m for m in voices["models"] if m["id"] == "openai"]
    assert [v["id"] for v in listed["voices"]] == ["alloy", "nova"]
    assert listed["sample_rate"] == RATE
    # What it is, without the key: the kind, the provider's model, where it is.
    assert listed["execution"]["provider_model"] == "gpt-4o-mini-tts"
    assert listed["execution"]["base_url"] == provider.url
    assert "sk-" not in str(voices)
    models = await (await client.get("/v1/models")).json()
    assert "openai" in {m["id"] for m in models["data"]}


async def test_the_provider_stopped_cached_texts_200_new_ones_503_within_timeout(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    client = await start(
        gateway, counting_engine, entry(provider, timeout_s=3, breaker_failures=2), metrics=metrics
    )
    r = await client.post("/v1/audio/speech", json=speech())
    assert r.status == 200
    await provider.stop()
    # Stored audio, in any format: still served.
    for fmt in ("wav", "mp3"):
        r = await client.post("/v1/audio/speech", json=speech(response_format=fmt))
        assert r.status == 200
    # A new text: an answer naming the upstream, within timeout_s.
    for i in range(2):
        started = time.monotonic()
        r = await client.post("/v1/audio/speech", json=speech(f"Something new, number {i}."))
        # Within timeout_s (3 s), told from the 30 s default with room for a loaded machine.
        assert time.monotonic() - started < 15
        assert r.status == 503, await r.text()
        err = (await r.json())["error"]
        assert "upstream 'openai'" in err["message"]
        assert err["code"] == "upstream_connection"
        assert int(r.headers["Retry-After"]) >= 1
    # Two failed misses in a row: the breaker is open and the next miss is not even tried.
    assert value(metrics, "voxgate_upstream_breaker_state", upstream="openai") == 2
    r = await client.post("/v1/audio/speech", json=speech("And another new one."))
    assert r.status == 503
    assert (await r.json())["error"]["code"] == "upstream_breaker_open"
    assert client.app[keys.SPEECH].store is not None  # the gateway itself stays up
    ready = await client.get("/readyz")
    assert ready.status == 200


async def test_a_retry_that_runs_out_of_time_reports_the_failure_that_caused_it(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    """A 503, then a retry that never answers: the caller hears the provider's failure (what an
    operator must fix), not the deadline voxgate's own retry ran into."""
    client = await start(gateway, counting_engine, entry(provider, timeout_s=1), metrics=metrics)
    provider.script.append(
        Scripted(503, "The engine is currently overloaded", {"Retry-After": "0"})
    )
    provider.script.append(Scripted(503, hang=True))
    r = await client.post("/v1/audio/speech", json=speech())
    assert r.status == 502
    assert (await r.json())["error"]["code"] == "upstream_server"
    assert provider.calls == 2
    assert value(metrics, "voxgate_upstream_calls_total", upstream="openai", result="timeout") == 1


async def test_a_provider_that_hangs_answers_503_within_timeout(
    gateway: GatewayFactory, counting_engine: CountingEngine, provider: OpenAISpeechServer
) -> None:
    client = await start(gateway, counting_engine, entry(provider, timeout_s=1))
    provider.hold.clear()  # the provider takes the call and never answers
    started = time.monotonic()
    r = await client.post("/v1/audio/speech", json=speech())
    assert time.monotonic() - started < 15  # the 1 s timeout_s, not the 30 s default
    assert r.status == 503
    assert (await r.json())["error"]["code"] == "upstream_timeout"
    provider.hold.set()


async def test_wrong_key_is_a_502_naming_the_upstream_not_the_callers_fault(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    client = await start(gateway, counting_engine, entry(provider))
    r = await client.post("/v1/audio/speech", json=speech())
    assert r.status == 502
    err = (await r.json())["error"]
    assert err["code"] == "upstream_auth" and "upstream 'openai'" in err["message"]
    assert "sk-wrong" not in err["message"]
    assert provider.calls == 1


async def test_max_concurrency_bounds_calls_in_flight(
    gateway: GatewayFactory, counting_engine: CountingEngine, provider: OpenAISpeechServer
) -> None:
    client = await start(gateway, counting_engine, entry(provider, max_concurrency=2))
    provider.hold.clear()
    posts = [
        asyncio.ensure_future(client.post("/v1/audio/speech", json=speech(f"Text number {i}.")))
        for i in range(6)
    ]
    await until(lambda: len(provider.bodies) == 2, 10, "two calls in flight")
    # Held calls do not let a third start.
    assert len(provider.bodies) == 2
    provider.hold.set()
    answers = await asyncio.gather(*posts)
    assert [r.status for r in answers] == [200] * 6
    assert provider.calls == 6


async def test_requests_per_minute_makes_calls_wait_then_refuses_past_timeout(
    gateway: GatewayFactory, counting_engine: CountingEngine, provider: OpenAISpeechServer
) -> None:
    client = await start(
        gateway, counting_engine, entry(provider, requests_per_minute=2, timeout_s=1)
    )
    for i in range(2):
        r = await client.post("/v1/audio/speech", json=speech(f"Text number {i}."))
        assert r.status == 200
    r = await client.post("/v1/audio/speech", json=speech("A third text."))
    assert r.status == 503
    assert (await r.json())["error"]["code"] == "upstream_rate_wait"
    assert provider.calls == 2


def test_the_upstreams_file_is_checked_naming_entry_and_field(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(
        '[[upstream]]\nname = "openai"\nkind = "openai"\nbase_url = "https://api.openai.com/v1/"\n'
        'api_key_env = "OPENAI_API_KEY"\nmodel = "gpt-4o-mini-tts"\nvoices = ["alloy"]\n'
    )
    (config,) = load_upstreams(path)
    assert config.base_url == "https://api.openai.com/v1"
    assert (config.split, config.format, config.sample_rate) == ("sentence", "pcm", 24000)
    for text, named in (
        (
            '[[upstream]]\nname = "x"\nkind = "openai"\nbase_url = "ftp://h"\nmodel = "m"\n',
            "base_url",
        ),
        ('[[upstream]]\nname = "x"\nkind = "nope"\nbase_url = "http://h"\nmodel = "m"\n', "kind"),
        (
            '[[upstream]]\nname = "x"\nkind = "openai"\nbase_url = "http://h"\nmodel = "m"\napi_key = "sk"\n',
            "api_key",
        ),
        (
            '[[upstream]]\nname = "x"\nkind = "openai"\nbase_url = "http://h"\nmodel = "m"\n' * 2,
            "two entries",
        ),
        ("[[upstream]\n", "upstreams file"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=named):
            load_upstreams(path)


def test_retry_after_forms() -> None:
    assert retry_after_of({"retry-after": "1"}) == 1.0
    assert retry_after_of({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_of({"retry-after": "soon"}) is None
    assert retry_after_of({}) is None
    later = retry_after_of({"retry-after": "Wed, 21 Oct 2099 07:28:00 GMT"})
    assert later is not None and later > 1e6


async def test_a_wyoming_server_is_an_upstream(
    gateway: GatewayFactory, counting_engine: CountingEngine, settings: Settings, metrics: Metrics
) -> None:
    """kind = "wyoming" through the wyoming package's client, against a real Wyoming server
    (another voxgate's, in this process): its PCM is the master; formats are transcodes."""
    port = free_port()
    await gateway(settings=settings.replace(wyoming_port=port))
    assert counting_engine.items == 0
    fleet = UpstreamConfig(
        name="fleet",
        kind="wyoming",
        base_url=f"tcp://127.0.0.1:{port}",
        voices=("joe",),
        sample_rate=22050,
        timeout_s=5,
        # Two calls a minute: a refusal that took a slot would leave none for the last text.
        requests_per_minute=2,
    )
    front = await gateway(settings=settings, engines={"piper": counting_engine, "fleet": fleet})
    body = {"model": "fleet", "input": GREETING, "voice": "joe", "response_format": "wav"}
    r = await front.post("/v1/audio/speech", json=body)
    assert r.status == 200, await r.text()
    audio, rate = sf.read(io.BytesIO(await r.read()))
    assert rate == 22050 and len(audio) > rate // 2
    for fmt in ("mp3", "pcm", "flac"):
        r = await front.post("/v1/audio/speech", json={**body, "response_format": fmt})
        assert r.status == 200
    assert counting_engine.texts == [GREETING]  # the Wyoming server synthesized it once
    # Wyoming has no speed: voxgate refuses before a call, with the reason, as its own error
    # (not "the upstream refused", not a provider error in the metrics).
    for speed in (2.0, 1.5):
        r = await front.post("/v1/audio/speech", json={**body, "input": "Faster.", "speed": speed})
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["code"] == "unsupported_speed" and err["param"] == "speed"
        assert "refused" not in err["message"] and "no speed" in err["message"]
        assert f"model 'fleet' cannot take speed {speed:g}" in err["message"]
    assert counting_engine.texts == [GREETING]
    r = await front.post("/v1/audio/speech", json={**body, "input": "At its own pace."})
    assert r.status == 200, await r.text()
    metrics.flush_pending()
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert not sample.name.startswith("voxgate_upstream_errors"), sample


def test_an_entry_must_fit_its_kind() -> None:
    good = {"name": "w", "kind": "wyoming", "base_url": "tcp://127.0.0.1:10200"}
    assert UpstreamConfig.model_validate(good).model == ""
    for bad, named in (
        ({**good, "base_url": "http://127.0.0.1:10200"}, "tcp://host:port"),
        ({**good, "base_url": "tcp://127.0.0.1"}, "tcp://host:port"),
        ({**good, "format": "wav"}, "pcm"),
        ({"name": "o", "kind": "openai", "base_url": "tcp://h:1", "model": "m"}, "http"),
        ({"name": "o", "kind": "openai", "base_url": "http://h"}, "model"),
    ):
        with pytest.raises(ValueError, match=named):
            UpstreamConfig.model_validate(bad)


async def test_requests_per_minute_is_one_budget_for_replicas_sharing_redis(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    settings: Settings,
    tmp_path: Path,
    redis: RedisServer,
) -> None:
    shared = settings.replace(redis_url=redis.url, cache_secret=CACHE_SECRET)
    config = entry(provider, requests_per_minute=3, timeout_s=1)
    a = await start(gateway, counting_engine, config, settings=shared)
    b = await start(
        gateway,
        counting_engine,
        config,
        settings=shared.replace(cache_dir=tmp_path / "b"),
        metrics=Metrics(),
    )
    for client, text in ((a, "One."), (b, "Two."), (a, "Three.")):
        r = await client.post("/v1/audio/speech", json=speech(text))
        assert r.status == 200, await r.text()
    # The fourth call of the minute, on either replica, finds no slot in the shared window.
    r = await b.post("/v1/audio/speech", json=speech("Four."))
    assert r.status == 503
    assert (await r.json())["error"]["code"] == "upstream_rate_wait"
    assert provider.calls == 3


async def test_as_the_default_model_say_urls_and_jambonz_speak_through_it(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    settings: Settings,
) -> None:
    """Telephony speaks with the default model: an upstream made the default serves say URLs
    and jambonz from the same sentence masters as the OpenAI route."""
    client = await start(
        gateway,
        counting_engine,
        entry(provider),
        settings=settings.replace(default_model="openai", default_voice="alloy"),
    )
    r = await client.get("/v1/say/alloy/Hello%20there..wav")
    assert r.status == 200, await r.text()
    assert provider.texts == ["Hello there."]
    r = await client.get("/v1/say/alloy/Hello%20there..ulaw")
    assert r.status == 200
    jambonz = {"type": "text", "text": "Hello there.", "voice": "alloy", "language": "en-US"}
    r = await client.post("/v1/jambonz/tts", json=jambonz)
    assert r.status == 200, await r.text()
    r = await client.post("/v1/audio/speech", json=speech("Hello there.", response_format="mp3"))
    assert r.status == 200
    assert provider.calls == 1
    assert counting_engine.items == 0  # the local voice said nothing


async def test_elevenlabs_through_its_published_api(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
) -> None:
    """kind = "elevenlabs" against a local server following ElevenLabs' published contract
    (tests/upstream_support.py cites it): pcm at the asked rate is the master, the entry's
    voice_settings (and the request's speed) go with each call and into the address."""
    server = await ElevenLabsServer().start()
    monkeypatch.setenv("VOXGATE_TEST_XI_KEY", server.api_key)
    voice = server.voices[0]
    try:
        config = UpstreamConfig(
            name="eleven",
            kind="elevenlabs",
            base_url=server.url,
            api_key_env="VOXGATE_TEST_XI_KEY",
            model="eleven_multilingual_v2",
            voices=(voice, "*"),
            sample_rate=22050,
            voice_settings={"stability": 0.5, "similarity_boost": 0.75},
            price_per_million_chars=180.0,
        )
        client = await start(gateway, counting_engine, config, metrics=metrics)
        body = {"model": "eleven", "input": GREETING, "voice": voice, "response_format": "wav"}
        for fmt in ("wav", "wav", "mp3", "pcm"):
            r = await client.post("/v1/audio/speech", json={**body, "response_format": fmt})
            assert r.status == 200, await r.text()
        _, rate = sf.read(
            io.BytesIO(await (await client.post("/v1/audio/speech", json=body)).read())
        )
        assert rate == 22050
        assert server.calls == 1
        ((sent_voice, query, sent),) = server.requests
        assert (sent_voice, query) == (voice, {"output_format": "pcm_22050"})
        assert sent == {
            "text": GREETING,
            "model_id": "eleven_multilingual_v2",
            "voice_settings": {"stability": 0.5, "similarity_boost": 0.75},
        }
        r = await client.post("/v1/audio/speech", json={**body, "speed": 1.1})
        assert r.status == 200 and server.calls == 2
        assert server.requests[-1][2]["voice_settings"]["speed"] == 1.1
        # An unknown voice id: the caller's 400, with ElevenLabs' message.
        r = await client.post("/v1/audio/speech", json={**body, "voice": "nosuchvoice"})
        assert r.status == 400
        assert "was not found" in (await r.json())["error"]["message"]
        saved = value(metrics, "voxgate_upstream_saved_total", upstream="eleven")
        assert saved == pytest.approx(4 * len(GREETING) * 180.0 / 1e6)
    finally:
        await server.stop()


# What polly and cartesia entries need beyond the others: polly's key id variable, region and
# engine (its `model`); cartesia's model id.
POLLY_EXTRA = {"key_id_env": "VOXGATE_TEST_AWS_KEY_ID", "region": "us-east-1", "model": "neural"}
CARTESIA_EXTRA = {"model": "sonic-2"}


@pytest.mark.parametrize(
    ("kind", "server_type", "rate", "extra"),
    [
        ("azure", AzureServer, 24000, {}),
        ("google", GoogleServer, 22050, {}),
        ("deepgram", DeepgramServer, 16000, {}),
        ("polly", PollyServer, 16000, POLLY_EXTRA),
        ("cartesia", CartesiaServer, 22050, CARTESIA_EXTRA),
    ],
)
async def test_providers_through_their_published_apis(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
    kind: str,
    server_type: type[ContractServer],
    rate: int,
    extra: dict[str, str],
) -> None:
    """Each of these kinds against a local server that follows that provider's published
    request and response shape (tests/upstream_support.py cites each): once per text, its
    lossless audio the master, its refusal the caller's 400, its 429 retried, a wrong key 502."""
    server = await server_type().start()  # type: ignore[call-arg]
    monkeypatch.setenv("VOXGATE_TEST_PROVIDER_KEY", server.api_key)
    monkeypatch.setenv("VOXGATE_TEST_AWS_KEY_ID", getattr(server, "key_id", ""))
    voice = server.voices[0]
    try:
        config = UpstreamConfig(
            name=kind,
            kind=kind,  # type: ignore[arg-type]
            base_url=server.url,
            api_key_env="VOXGATE_TEST_PROVIDER_KEY",
            voices=(voice, "*"),
            sample_rate=rate,
            max_retries=2,
            **extra,  # type: ignore[arg-type]
        )
        client = await start(gateway, counting_engine, config, metrics=metrics)
        body = {"model": kind, "input": GREETING, "voice": voice, "response_format": "wav"}
        for fmt in ("wav", "wav", "mp3", "pcm"):
            r = await client.post("/v1/audio/speech", json={**body, "response_format": fmt})
            assert r.status == 200, await r.text()
        r = await client.post("/v1/audio/speech", json=body)
        audio, got_rate = sf.read(io.BytesIO(await r.read()), dtype="int16")
        assert got_rate == rate
        expected = voiced(GREETING, 1.0, rate)
        assert audio.shape == expected.shape
        assert np.max(np.abs(audio.astype(np.int32) - expected)) <= 2
        assert server.calls == 1
        # A voice the provider does not have: the caller's 400 (not retried).
        r = await client.post("/v1/audio/speech", json={**body, "voice": "xx-XX-Nobody-1"})
        assert r.status == 400, await r.text()
        assert (await r.json())["error"]["code"] == "upstream_refused"
        assert server.calls == 2
        # 429 with Retry-After: retried after it, then served.
        server.script.append((429, {"Retry-After": "1"}, b""))
        r = await client.post("/v1/audio/speech", json={**body, "input": "A second text."})
        assert r.status == 200 and server.calls == 4
        retries = value(
            metrics, "voxgate_upstream_retries_total", upstream=kind, kind="rate_limited"
        )
        assert retries == 1
    finally:
        await server.stop()
    # The key from the environment, and nothing else, authorized the calls.
    monkeypatch.setenv("VOXGATE_TEST_PROVIDER_KEY", "wrong")
    server = await server_type().start()  # type: ignore[call-arg]
    try:
        config = UpstreamConfig(
            name=kind,
            kind=kind,  # type: ignore[arg-type]
            base_url=server.url,
            api_key_env="VOXGATE_TEST_PROVIDER_KEY",
            voices=(voice,),
            sample_rate=rate,
            **extra,  # type: ignore[arg-type]
        )
        client = await start(gateway, counting_engine, config, metrics=Metrics())
        r = await client.post("/v1/audio/speech", json=body)
        assert r.status == 502
        assert (await r.json())["error"]["code"] == "upstream_auth"
    finally:
        await server.stop()


async def test_polly_signs_its_calls_and_sends_rates_as_ssml(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
) -> None:
    """kind = "polly" against a local SynthesizeSpeech following Polly's published service
    model (botocore's ``botocore/data/polly/2016-06-10/service-2.json``; the server verifies the
    AWS Signature Version 4 itself, tests/upstream_support.py cites both): the body as the model
    has it, pcm at 8 kHz the master, the Engine and LanguageCode sent and in the address, a rate
    sent as SSML with TextType ssml, a ValidationException the caller's 400 with Polly's words, a
    ThrottlingException retried."""
    server = await PollyServer(region="eu-west-1").start()
    monkeypatch.setenv("VOXGATE_TEST_AWS_SECRET", server.api_key)
    monkeypatch.setenv("VOXGATE_TEST_AWS_KEY_ID", server.key_id)
    try:
        common: dict[str, Any] = {
            "kind": "polly",
            "base_url": server.url,
            "api_key_env": "VOXGATE_TEST_AWS_SECRET",
            "key_id_env": "VOXGATE_TEST_AWS_KEY_ID",
            "region": "eu-west-1",
            "voices": ["Joanna", "*"],
            "sample_rate": 8000,
            "max_retries": 1,
        }
        neural = UpstreamConfig.model_validate(
            {**common, "name": "polly", "model": "neural", "language": "en_US"}
        )
        standard = UpstreamConfig.model_validate({**common, "name": "polly-std"})
        client = await start(gateway, counting_engine, neural, standard, metrics=metrics)
        body = {"model": "polly", "input": GREETING, "voice": "Joanna", "response_format": "wav"}
        for fmt in ("wav", "mp3", "pcm"):
            r = await client.post("/v1/audio/speech", json={**body, "response_format": fmt})
            assert r.status == 200, await r.text()
        assert server.calls == 1
        assert server.bodies[0] == {
            "OutputFormat": "pcm",
            "SampleRate": "8000",
            "VoiceId": "Joanna",
            "Text": GREETING,
            "TextType": "text",
            "Engine": "neural",
            "LanguageCode": "en-US",
        }
        auth = server.requests[0][2]["Authorization"]
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDPOLLYTEST/")
        assert "/eu-west-1/polly/aws4_request" in auth
        # The other engine is another address: a call of its own, without Engine.
        r = await client.post("/v1/audio/speech", json={**body, "model": "polly-std"})
        assert r.status == 200 and server.calls == 2
        assert "Engine" not in server.bodies[1] and "LanguageCode" not in server.bodies[1]
        # A rate (here the request's speed) goes as Polly SSML.
        r = await client.post("/v1/audio/speech", json={**body, "speed": 1.25})
        assert r.status == 200, await r.text()
        assert server.bodies[2]["TextType"] == "ssml"
        assert server.bodies[2]["Text"] == (
            f'<speak><prosody rate="125%">{GREETING}</prosody></speak>'
        )
        # SSML from the client: expanded by voxgate, its rate sent as Polly SSML too.
        ssml = '<speak><prosody rate="slow">Please hold &amp; wait.</prosody></speak>'
        r = await client.post("/v1/audio/speech", json={**body, "input": ssml})
        assert r.status == 200, await r.text()
        assert server.bodies[3]["TextType"] == "ssml"
        assert "Please hold &amp; wait." in server.bodies[3]["Text"]
        # A voice Polly does not have: the caller's 400 with Polly's own message, not retried.
        r = await client.post("/v1/audio/speech", json={**body, "voice": "Nobody"})
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["code"] == "upstream_refused"
        assert "ValidationException" in err["message"]
        assert "Value 'Nobody' at 'voiceId' failed to satisfy constraint" in err["message"]
        assert server.calls == 5
        # Throttling is a 400 with a throttling code in AWS's APIs: retried like a 429.
        throttled = {
            "x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/",
            "Retry-After": "0",
        }
        server.script.append((400, throttled, b'{"message": "Rate exceeded"}'))
        r = await client.post("/v1/audio/speech", json={**body, "input": "Another text."})
        assert r.status == 200, await r.text()
        assert server.calls == 7
        assert (
            value(metrics, "voxgate_upstream_retries_total", upstream="polly", kind="rate_limited")
            == 1
        )
    finally:
        await server.stop()


async def test_cartesia_through_its_published_api(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
) -> None:
    """kind = "cartesia" against a local ``/tts/bytes`` following Cartesia's API reference
    (docs.cartesia.ai, "Text to Speech (Bytes)" for API version 2025-04-16, and "API Errors";
    tests/upstream_support.py cites it): X-API-Key and Cartesia-Version, the body as published,
    raw pcm_s16le the master, language and speed sent, an unknown voice the caller's 400 with
    Cartesia's message."""
    server = await CartesiaServer().start()
    monkeypatch.setenv("VOXGATE_TEST_CARTESIA_KEY", server.api_key)
    voice = server.voices[0]
    try:
        config = UpstreamConfig(
            name="cartesia",
            kind="cartesia",
            base_url=server.url,
            api_key_env="VOXGATE_TEST_CARTESIA_KEY",
            model="sonic-2",
            voices=(voice, "*"),
            language="en_US",
            sample_rate=24000,
            price_per_million_chars=65.0,
        )
        client = await start(gateway, counting_engine, config, metrics=metrics)
        body = {"model": "cartesia", "input": GREETING, "voice": voice, "response_format": "wav"}
        for fmt in ("wav", "wav", "flac", "pcm"):
            r = await client.post("/v1/audio/speech", json={**body, "response_format": fmt})
            assert r.status == 200, await r.text()
        assert server.calls == 1
        headers = server.requests[0][2]
        assert headers["X-API-Key"] == server.api_key
        assert headers["Cartesia-Version"] == "2025-04-16"
        assert server.bodies[0] == {
            "model_id": "sonic-2",
            "transcript": GREETING,
            "voice": {"mode": "id", "id": voice},
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
            "language": "en",
        }
        r = await client.post("/v1/audio/speech", json={**body, "speed": 1.2})
        assert r.status == 200 and server.bodies[1]["generation_config"] == {"speed": 1.2}
        # Outside Cartesia's speeds: refused by voxgate before a call, voxgate's error.
        r = await client.post("/v1/audio/speech", json={**body, "speed": 2.0})
        assert r.status == 400 and server.calls == 2
        assert (await r.json())["error"]["code"] == "unsupported_speed"
        assert value(metrics, "voxgate_upstream_errors_total", upstream="cartesia") == 0
        r = await client.post("/v1/audio/speech", json={**body, "voice": "no-such-voice"})
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["code"] == "upstream_refused"
        assert "Not Found: Voice no-such-voice not found" in err["message"]
        saved = value(metrics, "voxgate_upstream_saved_total", upstream="cartesia")
        assert saved == pytest.approx(3 * len(GREETING) * 65.0 / 1e6)
    finally:
        await server.stop()


def test_polly_and_cartesia_entries_must_fit_their_kind() -> None:
    polly = {
        "name": "p",
        "kind": "polly",
        "base_url": "https://polly.eu-central-1.amazonaws.com",
        "api_key_env": "AWS_SECRET_ACCESS_KEY",
        "sample_rate": 16000,
    }
    assert aws_region(UpstreamConfig.model_validate(polly)) == "eu-central-1"
    cartesia = {"name": "c", "kind": "cartesia", "base_url": "https://api.cartesia.ai"}
    for bad, named in (
        ({**polly, "sample_rate": 24000}, "8000, 16000"),
        ({**polly, "model": "turbo"}, "Engine"),
        ({**polly, "base_url": "http://127.0.0.1:9"}, "region"),
        ({**polly, "api_key_env": ""}, "api_key_env"),
        (cartesia, "model"),
        ({**cartesia, "model": "sonic-2", "region": "us-east-1"}, "polly"),
    ):
        with pytest.raises(ValueError, match=named):
            UpstreamConfig.model_validate(bad)
    # Where polly's calls are signed, and with which credentials, takes a restart.
    engine = UpstreamEngine(UpstreamConfig.model_validate(polly))
    moved = UpstreamConfig.model_validate({**polly, "region": "us-west-2"})
    assert "region" in engine.reconfigure(moved)
    assert engine.reconfigure(UpstreamConfig.model_validate({**polly, "timeout_s": 9})) == ""
    # The language these kinds send is in their address; other kinds' is not.
    a = UpstreamConfig.model_validate({**polly, "language": "en_US"})
    b = UpstreamConfig.model_validate({**polly, "language": "en_GB"})
    assert a.address_material() != b.address_material()
    assert (
        "language"
        not in UpstreamConfig.model_validate(
            {
                "name": "o",
                "kind": "openai",
                "base_url": "http://h",
                "model": "m",
                "language": "en_US",
            }
        ).address_material()
    )


async def test_a_streamed_miss_passes_the_providers_pcm_on_as_it_arrives(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
) -> None:
    """Streaming pass-through: pcm asked with ``stream`` from an upstream that sends pcm at
    that rate reaches the client piece by piece as the provider sends it, before the provider
    has finished (it holds its second half until the client has the first), while the whole is
    stored: the next request is a hit with the same bytes (each piece as the stored rendition
    holds its samples)."""
    client = await start(gateway, counting_engine, entry(provider))
    provider.parted = True
    text = "Your call is important to us."
    body = speech(text, response_format="pcm", stream=True)
    r = await client.post("/v1/audio/speech", json=body)
    assert r.status == 200, await r.text()
    assert r.headers["X-Cache"] == "MISS"
    first = await r.content.readany()
    # The first piece is here, and the provider cannot have sent the rest: it waits for `rest`,
    # set only now.
    assert provider.half_sent.is_set() and not provider.rest.is_set()
    assert first and len(first) < 2 * len(voiced(text))
    provider.rest.set()
    streamed = first + await r.read()
    again = await client.post("/v1/audio/speech", json=speech(text, response_format="pcm"))
    assert again.headers["X-Cache"] == "HIT"
    assert await again.read() == streamed
    heard = np.frombuffer(streamed, dtype="<i2").astype(np.int32)
    assert heard.shape == voiced(text).shape
    assert np.max(np.abs(heard - voiced(text))) <= 2  # the master's 16-bit round trip
    assert provider.calls == 1


async def test_pass_through_follows_each_sentence_and_a_stored_one_comes_whole(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
) -> None:
    """Two sentences, the first stored: the stream sends the stored one, the pause, then the
    new sentence's pieces as they arrive; another rate than the provider's is not passed."""
    client = await start(gateway, counting_engine, entry(provider))
    a, b = "Thank you for calling.", "Please hold the line."
    r = await client.post("/v1/audio/speech", json=speech(a, response_format="pcm"))
    assert r.status == 200
    provider.parted = True
    r = await client.post(
        "/v1/audio/speech", json=speech(f"{a} {b}", response_format="pcm", stream=True)
    )
    assert r.status == 200, await r.text()
    got = b""
    pause = bytes(2 * round(0.25 * RATE))  # sentence_pause_ms 250 at 24 kHz
    # The stored sentence and the pause come first, then the first half of the new one.
    while len(got) < 2 * len(voiced(a)) + len(pause) + 2:
        got += await r.content.readany()
    assert not provider.rest.is_set()
    provider.rest.set()
    got += await r.read()
    assert len(got) == 2 * len(voiced(a)) + len(pause) + 2 * len(voiced(b))
    assert got.endswith(as_rendered_pcm16(voiced(b).tobytes()))
    assert provider.calls == 2


async def test_a_wyoming_upstream_passes_its_chunks_on_at_its_own_rate_only() -> None:
    """Wyoming's audio-chunk events go to the item's sink as they arrive (before the server's
    last chunk, which it holds), when they are at the entry's rate: chunks at another rate
    pass nothing (the stream resamples the whole). Google's JSON answer never passes."""
    from synth.providers.wyoming_tcp import WyomingProvider

    server = await HeldWyomingServer(parts=3).start()
    text = "Please hold."
    try:
        for rate, passes in ((RATE, True), (16000, False)):
            server.rest.clear()
            server.half_sent.clear()
            config = UpstreamConfig(
                name="w", kind="wyoming", base_url=server.url, sample_rate=rate, voices=("alloy",)
            )
            provider = WyomingProvider(config, "", {})
            got: list[bytes] = []
            arrived = asyncio.Event()

            def sink(data: bytes, got: list[bytes] = got, arrived: asyncio.Event = arrived) -> None:
                got.append(data)
                arrived.set()

            item = SynthesisItem(text, "alloy", sink=sink)
            call = asyncio.ensure_future(provider.synthesize(item, 10))
            if passes:
                async with asyncio.timeout(10):
                    await arrived.wait()  # a piece before the server sent its last one
                assert not server.rest.is_set() and not call.done()
            else:
                await until(server.half_sent.is_set, 10, "the server sent its first chunks")
            server.rest.set()
            audio = await call
            assert audio.sample_rate == RATE
            assert b"".join(got) == (voiced(text).tobytes() if passes else b"")
    finally:
        await server.stop()
    google = UpstreamConfig(name="g", kind="google", base_url="https://h", sample_rate=RATE)
    assert not google.streams_pcm


async def test_pieces_cut_inside_a_sample_pass_as_the_rendition_holds_them() -> None:
    """A provider's chunk may end inside a sample (an HTTP body's edge, a pool frame's): the
    odd byte waits for the next piece, and what passes is the rendition's samples."""
    from synth.pieces import Pieces

    data = voiced("Cut anywhere.").tobytes()
    partial = Pieces(convert=as_rendered_pcm16)
    for cut in (1, 2, 3, 4, 7, 8, 101):
        partial(data[:cut])
        data = data[cut:]
    partial(data)
    partial.finish()
    passed = b"".join([piece async for piece in partial.follow()])
    assert passed == as_rendered_pcm16(voiced("Cut anywhere.").tobytes())


async def test_invented_voice_ids_are_one_other_label(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    metrics: Metrics,
) -> None:
    """voices = ["*"] passes any voice id to the provider: ids the config does not list (nova and
    coral here, which this provider has) are labelled ``other`` in the metrics (bounded), the
    listed ones by name."""
    client = await start(
        gateway, counting_engine, entry(provider, voices=["alloy", "*"]), metrics=metrics
    )
    for voice in ("alloy", "nova", "coral", "nova"):  # (the second nova: a hit)
        r = await client.post("/v1/audio/speech", json=speech(voice=voice))
        assert r.status == 200, await r.text()
    scraped = await (await client.get("/metrics")).text()
    voices: dict[str, float] = {}
    for family in text_string_to_metric_families(scraped):
        for sample in family.samples:
            if (
                sample.name == "voxgate_speech_requests_total"
                and sample.labels["model"] == "openai"
            ):
                label = sample.labels["voice"]
                voices[label] = voices.get(label, 0.0) + sample.value
    assert voices == {"alloy": 1, "other": 3}, voices
    assert provider.calls == 3
