"""The provider is a network peer, not a trusted library: its redirects are not followed (the
key and the text would go wherever they point), its ``Retry-After`` is read as a bounded number,
and its answer is read within what the text can take and the pool's frame can carry, a refused
one freed and not asked for again at once (docs/upstreams.md, "How it treats the provider")."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from metrics import Metrics
from synth.engine import SynthesisItem
from synth.providers import SPECS
from synth.providers.base import (
    MAX_RETRY_AFTER_S,
    MIB,
    AnswerReader,
    ProviderError,
    retry_after_of,
)
from synth.upstream import OVERSIZE_HOLD_S, UpstreamConfig
from tests.conftest import GatewayFactory
from tests.served import DefaultServer
from tests.support import CountingEngine
from tests.upstream_support import (
    KEY_ENV,
    AnswerServer,
    AzureServer,
    CartesiaServer,
    DeepgramServer,
    ElevenLabsServer,
    GoogleServer,
    LoopbackProvider,
    OpenAISpeechServer,
    PollyServer,
    Scripted,
    voiced,
    wav_header,
)

GREETING = "Thank you for calling."
# The variable polly entries name for their access key id.
ID_ENV = "VOXGATE_TEST_AWS_KEY_ID"


class Redirector(LoopbackProvider):
    """A provider host that answers every call with ``status`` pointing at ``target`` (the
    same path there): ``calls`` counts what reached it."""

    def __init__(self, target: str, status: int = 307) -> None:
        super().__init__()
        self.target = target
        self.status = status
        self.calls = 0
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self) -> Redirector:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        where = self.target + request.path_qs
        return web.Response(status=self.status, headers={"Location": where})


def value(metrics: Metrics, name: str, **labels: str) -> float:
    metrics.flush_pending()
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def start(
    gateway: GatewayFactory, counting_engine: CountingEngine, config: UpstreamConfig, **kw: Any
) -> Any:
    return await gateway(engines={"piper": counting_engine, config.name: config}, **kw)


# Each kind that calls its provider over HTTP: its local imitation, and what its entry needs
# beyond a base URL, a key and a voice.
HTTP_KINDS: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "openai": (OpenAISpeechServer, {"model": "gpt-4o-mini-tts"}),
    "elevenlabs": (ElevenLabsServer, {"model": "eleven_multilingual_v2", "sample_rate": 22050}),
    "azure": (AzureServer, {}),
    "google": (GoogleServer, {}),
    "deepgram": (DeepgramServer, {}),
    "polly": (
        PollyServer,
        {"key_id_env": ID_ENV, "region": "us-east-1", "model": "neural", "sample_rate": 16000},
    ),
    "cartesia": (CartesiaServer, {"model": "sonic-2"}),
}


def test_every_http_kind_is_tried_with_a_redirect() -> None:
    assert set(HTTP_KINDS) == {kind for kind, spec in SPECS.items() if spec.scheme == "http"}


@pytest.mark.parametrize("kind", sorted(HTTP_KINDS))
async def test_a_redirect_is_not_followed_nor_stored(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
    kind: str,
) -> None:
    """As found: a 307 from the ElevenLabs host sent ``xi-api-key`` and the text to the
    redirect target, and the target's answer was cached (the openai SDK's own HTTP client
    follows redirects too, unless told otherwise). Now, for every kind and every redirect
    status, the target is never asked, the client hears a 502 naming the redirect, and nothing
    is stored (the next request asks the provider again)."""
    make, extra = HTTP_KINDS[kind]
    elsewhere = await make().start()
    redirector = await Redirector(f"http://127.0.0.1:{elsewhere.port}").start()
    monkeypatch.setenv(KEY_ENV, elsewhere.api_key)
    monkeypatch.setenv(ID_ENV, getattr(elsewhere, "key_id", ""))
    voice = elsewhere.voices[0]
    try:
        config = UpstreamConfig(
            name=kind,
            kind=kind,  # type: ignore[arg-type]
            base_url=elsewhere.url.replace(str(elsewhere.port), str(redirector.port)),
            api_key_env=KEY_ENV,
            voices=(voice,),
            timeout_s=5,
            **extra,
        )
        client = await start(gateway, counting_engine, config, metrics=metrics)
        body = {"model": kind, "input": GREETING, "voice": voice, "response_format": "wav"}
        statuses = (301, 302, 307, 308)
        for status in statuses:
            redirector.status = status
            r = await client.post("/v1/audio/speech", json=body)
            assert r.status == 502, await r.text()
            message = (await r.json())["error"]["message"]
            assert f"redirect ({status})" in message
            assert elsewhere.api_key not in message
        assert elsewhere.calls == 0
        # Not retried (the next try is redirected too), and not stored: each request asks.
        assert redirector.calls == len(statuses)
        assert value(metrics, "voxgate_upstream_errors_total", upstream=kind, kind="server")
    finally:
        await redirector.stop()
        await elsewhere.stop()


@pytest.mark.parametrize(
    "asked",
    [
        "inf",
        "nan",
        "1e999",
        "1" * 40,
        "Wed, 21 Oct 2099 07:28:00 GMT",
        "Wed, 21 Oct 2099 07:28:00",
        "-5",
        "soon",
    ],
)
async def test_a_providers_retry_after_is_bounded_by_the_calls_timeout_never_relayed_raw(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    asked: str,
) -> None:
    """As found: ``Retry-After: inf`` on a 429 gave a 500 with a traceback, and a 40-digit one
    was passed on to the client as it came. Now each is the client's 503 with a Retry-After of
    at most the upstream's ``timeout_s`` (whole seconds), in no time: a wait longer than the
    deadline is not waited for."""
    config = UpstreamConfig(
        name="openai",
        kind="openai",
        base_url=provider.url,
        api_key_env=KEY_ENV,
        model="gpt-4o-mini-tts",
        voices=("alloy",),
        timeout_s=3,
        max_retries=1,
    )
    client = await start(gateway, counting_engine, config)
    provider.script.append(Scripted(429, "Rate limit reached", {"Retry-After": asked}))
    body = {"model": "openai", "input": GREETING, "voice": "alloy", "response_format": "wav"}
    r = await client.post("/v1/audio/speech", json=body)
    if asked in ("-5", "soon", "nan"):  # retried: at once, or after the runner's own backoff
        assert r.status == 200, await r.text()
        assert provider.calls == 2
        return
    assert r.status == 503, await r.text()
    assert (await r.json())["error"]["code"] == "upstream_rate_limited"
    assert 1 <= int(r.headers["Retry-After"]) <= 3
    assert provider.calls == 1


def test_retry_after_is_finite_whatever_is_sent() -> None:
    for asked in ("inf", "1e999", "9" * 40, "Wed, 21 Oct 2099 07:28:00 GMT"):
        assert retry_after_of({"retry-after": asked}) == MAX_RETRY_AFTER_S
    assert retry_after_of({"retry-after-ms": "nan", "retry-after": "2"}) == 2.0
    assert retry_after_of({"retry-after": "nan"}) is None
    assert retry_after_of({"retry-after": "-5"}) == 0.0
    # An HTTP date without its zone is GMT (not the machine's local time).
    naive = retry_after_of({"retry-after": "Wed, 21 Oct 2099 07:28:00"})
    assert naive == MAX_RETRY_AFTER_S


LONG_TEXT = " ".join(["Please hold while we connect your call to the next free agent"] * 6)


def reader_entry(**fields: object) -> UpstreamConfig:
    base = {"name": "p", "kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    return UpstreamConfig.model_validate({**base, **fields})


class Endless:
    """A body of ``piece`` again and again; ``taken`` counts the bytes the reader took."""

    def __init__(self, piece: bytes, head: bytes = b"") -> None:
        self.piece, self.head, self.taken = piece, head, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.head:
            self.taken += len(self.head)
            yield self.head
        while True:
            self.taken += len(self.piece)
            yield self.piece


async def test_an_answer_past_max_audio_mb_is_refused_and_nothing_of_it_stays_held() -> None:
    """As found: 60-70 MiB answers left about 1.96 GB held afterwards. The refusal (kept, as a
    failed task or a held error keeps it, its traceback whole) holds none of what was read."""
    config = reader_entry(max_audio_mb=1)
    item = SynthesisItem(LONG_TEXT, "alloy")  # at most 39 s: 1.8 MB of pcm
    body = Endless(voiced("an answer that will not stop")[:32768].tobytes())
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with pytest.raises(ProviderError) as caught:
            await AnswerReader(config, item).read(body)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    err = caught.value
    assert err.__traceback__ is not None
    assert err.oversize and "larger than 1 MiB of pcm (max_audio_mb)" in err.message
    assert MIB <= body.taken <= MIB + 64 * 1024
    assert kept < 256 * 1024, f"{kept} bytes still held after the refusal"


async def test_max_audio_mb_bounds_the_takes_samples_whatever_the_wav_holds() -> None:
    """``max_audio_mb`` counts 16-bit pcm (the pool's frame carries twice that, as float32): an
    8-bit WAV holds twice the samples per byte, and an 8 kHz one asked for 24 kHz pcm makes three
    times as many once resampled. Each is cut off at the samples, not at the bytes."""
    config = reader_entry(max_audio_mb=1, sample_rate=24000)
    item = SynthesisItem(LONG_TEXT, "alloy")
    for rate, bits, per_sample in ((24000, 8, 1), (8000, 16, 2)):
        body = Endless(bytes(range(256)) * 64, wav_header(rate, 0xFFFFFFFF, bits=bits))
        with pytest.raises(ProviderError) as caught:
            await AnswerReader(config, item).read(body)
        assert caught.value.oversize
        most = MIB // 2 * rate // 24000  # samples at the WAV's rate that fit once resampled
        # (a WAV may hold 64 KiB of header chunks before its samples)
        assert body.taken <= 64 * 1024 + most * per_sample + 16384


async def test_an_oversize_answer_is_not_asked_for_again_within_the_hold(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """As found: an answer too large for voxgate failed every time and was billed again each
    time a client retried. Now the same request within the hold is refused without a call,
    saying why and when to come back; another text is still asked for."""
    with AnswerServer() as answers:
        config = UpstreamConfig(
            name="runaway",
            kind="openai",
            base_url=answers.base_url("endless"),
            model="m",
            voices=("alloy",),
            timeout_s=10,
        )
        client = await start(gateway, counting_engine, config)
        body = {"model": "runaway", "input": GREETING, "voice": "alloy", "response_format": "wav"}
        r = await client.post("/v1/audio/speech", json=body)
        assert r.status == 502, await r.text()
        assert "too_long" in (await r.json())["error"]["message"]
        for _ in range(3):
            r = await client.post("/v1/audio/speech", json=body)
            assert r.status == 502
            error = (await r.json())["error"]
            assert error["code"] == "upstream_bad_reply"
            assert "not asked again for" in error["message"]
            assert 1 <= int(r.headers["Retry-After"]) <= OVERSIZE_HOLD_S
        assert answers.calls["endless"] == 1
        r = await client.post("/v1/audio/speech", json={**body, "input": "Another text."})
        assert r.status == 502 and answers.calls["endless"] == 2


@pytest.mark.slow
async def test_an_answer_within_max_audio_mb_fits_the_pool_processs_reply_frame(
    tmp_path: Path,
) -> None:
    """As found, against ``voxgate serve`` (the host's pool process makes the calls and sends
    each take to the gateway process as float32): an answer within ``max_audio_mb`` but over
    half of ``synth_max_reply_mb`` was refused at the frame, 503 every time, and billed again
    each time. Here 1 MB of pcm (2 MB as float32) with a 1 MiB frame setting: the frame is sized
    from the entry, so the answer is served, stored, and asked for once."""
    provider = await OpenAISpeechServer().start()
    upstreams = tmp_path / "upstreams.toml"
    upstreams.write_text(
        "[[upstream]]\n"
        'name = "openai"\nkind = "openai"\n'
        f'base_url = "{provider.url}"\napi_key_env = "{KEY_ENV}"\n'
        'model = "gpt-4o-mini-tts"\nvoices = ["alloy"]\nsplit = "whole"\n'
        "max_audio_mb = 2\ntimeout_s = 30\n"
    )
    server = DefaultServer(
        tmp_path / "s",
        "--upstreams-file",
        str(upstreams),
        "--synth-max-reply-mb",
        "1",
        env={KEY_ENV: provider.api_key},
    )
    body = {"model": "openai", "input": LONG_TEXT, "voice": "alloy", "response_format": "wav"}
    try:
        await asyncio.to_thread(server.wait_ready)
        for cache in ("MISS", "HIT"):
            status, headers, _ = await server.request("POST", "/v1/audio/speech", json=body)
            assert status == 200, server.logs()[-2000:]
            assert headers["X-Cache"] == cache
        assert provider.calls == 1
    finally:
        server.terminate()
        await provider.stop()
