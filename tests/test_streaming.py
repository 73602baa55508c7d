"""Streaming: chunked audio, sentence by sentence, before the whole text is synthesized; a client
that leaves ends only its own stream and the full audio is still cached."""

from __future__ import annotations

import asyncio
import io
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from bench.harness import speech_body
from metrics import Metrics
from synth.engine import Audio, SynthesisItem
from synth.errors import EngineError
from synth.piper_engine import PiperEngine
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, GatedEngine, until

FIVE = (
    "Welcome to the support line. Your ticket number is 7 4 2. "
    "An agent will call you back today. Press star to return to the menu. Goodbye."
)


def body(**kw: Any) -> dict[str, Any]:
    return speech_body(FIVE, **kw)


def ffmpeg_pcm(data: bytes, tmp: Path, demux: Sequence[str] = ()) -> np.ndarray[Any, Any]:
    path = tmp / "stream.bin"
    path.write_bytes(data)
    out = subprocess.run(
        ["ffmpeg", "-v", "error", *demux, "-i", str(path), "-f", "s16le", "-ac", "1", "-"],
        capture_output=True,
        check=True,
    )
    return np.frombuffer(out.stdout, dtype=np.int16)


async def wait_for_stored(client: Any, key: str) -> bytes:
    for _ in range(400):
        r = await client.get(f"/v1/audio/{key}")
        if r.status == 200:
            return bytes(await r.read())
        await asyncio.sleep(0.05)
    raise AssertionError("the streamed rendition was never stored")


async def test_first_sentence_streams_before_the_rest_is_synthesized(
    gateway: GatewayFactory, gated: GatedEngine, tmp_path: Path
) -> None:
    client = await gateway(engines={"piper": gated})
    resp = await client.post("/v1/audio/speech", json=body(stream=True))
    assert resp.status == 200
    assert resp.headers["Transfer-Encoding"] == "chunked"
    assert "Content-Length" not in resp.headers
    assert "ETag" not in resp.headers
    first = b""
    while len(first) < 2000:
        first += await resp.content.readany()
    # Audio is flowing while sentences 2-5 are held back by the gate.
    assert gated.items == 1
    assert first[:4] == b"RIFF" and first[4:8] == b"\xff\xff\xff\xff"
    gated.gate.set()
    data = first + await resp.read()
    assert gated.items == 5
    streamed = ffmpeg_pcm(data, tmp_path)
    # At the voice's own rate the stream carries exactly the stored rendition's samples.
    stored = await wait_for_stored(client, resp.headers["X-Audio-Key"])
    pcm, rate = sf.read(io.BytesIO(stored), dtype="int16")
    assert rate == 22050
    assert np.array_equal(streamed, pcm)


@pytest.mark.parametrize("fmt", ["ulaw", "pcm", "mulaw", "mp3", "aac"])
async def test_streamed_formats_decode(
    gateway: GatewayFactory, tmp_path: Path, fmt: str, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    text = "One moment please. Connecting your call. Thank you for waiting. Goodbye."
    resp = await client.post(
        "/v1/audio/speech",
        json=body(input=text, response_format=fmt, stream_format="audio"),
    )
    assert resp.status == 200, await resp.text()
    assert resp.headers["Transfer-Encoding"] == "chunked"
    data = await resp.read()
    rate = int(resp.headers["X-Audio-Sample-Rate"])
    demux = {"ulaw": ["-f", "mulaw"], "pcm": ["-f", "s16le"]}.get(fmt, [])
    if demux:
        demux += ["-ar", str(rate), "-ac", "1"]
    streamed = ffmpeg_pcm(data, tmp_path, demux)
    stored = await wait_for_stored(client, resp.headers["X-Audio-Key"])
    whole = ffmpeg_pcm(stored, tmp_path, demux)
    if fmt in ("ulaw", "pcm", "mulaw"):
        # One resampler for the whole stream: the samples a client streamed are the stored ones,
        # at a rate other than the voice's too (pcm is 24 kHz, ulaw 8 kHz, the voice 22.05 kHz).
        assert np.array_equal(streamed, whole)
    # MP3 and AAC run one encoder for the whole stream: no encoder delay or padded frame at the
    # sentence joins (that cost ~1,500 MP3 samples per sentence before), only the raw MP3
    # stream's one undeclared encoder delay.
    slack = {"mp3": 1152 + 1105, "aac": 1024}.get(fmt, 0)
    assert abs(len(streamed) - len(whole)) <= slack, (len(streamed), len(whole))
    assert np.abs(streamed).max() > 1000
    assert counting_engine.items == 4


async def test_disconnect_ends_only_that_stream_and_the_audio_is_still_cached(
    gateway: GatewayFactory, gated: GatedEngine, metrics: Metrics
) -> None:
    client = await gateway(engines={"piper": gated})
    resp = await client.post("/v1/audio/speech", json=body(stream=True))
    key = resp.headers["X-Audio-Key"]
    assert len(await resp.content.readany()) > 0
    resp.close()  # the client hangs up after the first sentence
    gated.gate.set()
    # A second client joins the same text while the first is gone, and gets it whole.
    other = await client.post("/v1/audio/speech", json=body(stream=False))
    assert other.status == 200
    assert other.headers["X-Audio-Key"] == key
    whole = await other.read()
    assert await wait_for_stored(client, key) == whole
    assert gated.items == 5  # nothing was synthesized twice, nothing was abandoned
    await until(
        lambda: metrics.registry.get_sample_value(
            "voxgate_streams_total", {"outcome": "disconnected"}
        ),
        60,
        "the disconnected stream counted",
    )
    assert (
        metrics.registry.get_sample_value("voxgate_streams_total", {"outcome": "disconnected"})
        == 1.0
    )
    assert (await client.get("/healthz")).status == 200


async def test_stream_of_stored_audio_is_a_plain_response(gateway: GatewayFactory) -> None:
    client = await gateway()
    r1 = await client.post("/v1/audio/speech", json=body(input="Hello there."))
    r2 = await client.post("/v1/audio/speech", json=body(input="Hello there.", stream=True))
    assert r2.headers["X-Cache"] == "HIT"
    assert int(r2.headers["Content-Length"]) == len(await r1.read())


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": True, "response_format": "flac"}, "response_format"),
        ({"stream": True, "response_format": "opus"}, "response_format"),
        ({"stream_format": "events"}, "stream_format"),
        ({"stream_format": "sse", "response_format": "flac"}, "response_format"),
        ({"stream": False, "stream_format": "sse"}, "stream"),
        ({"stream": "yes"}, "stream"),
        ({"stream": False, "stream_format": "audio"}, "stream"),
    ],
)
async def test_bad_stream_requests(
    gateway: GatewayFactory, extra: dict[str, Any], param: str
) -> None:
    client = await gateway()
    r = await client.post("/v1/audio/speech", json=body(**extra))
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == param
    if param == "response_format":
        assert "streamable formats: wav, pcm, mp3" in err["message"]


class FailingEngine(CountingEngine):
    """The real voice, except that any sentence containing "explode" fails."""

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        if any("explode" in i.text for i in items):
            raise EngineError("the voice failed on this input")
        return super().synthesize_batch(items)


async def test_engine_failure_before_and_after_the_first_chunk(
    gateway: GatewayFactory, piper_engine: PiperEngine, metrics: Metrics
) -> None:
    client = await gateway(engines={"piper": FailingEngine(piper_engine)})
    # First sentence fails: nothing was sent yet, so the client gets a proper JSON error.
    r = await client.post(
        "/v1/audio/speech", json=body(input="We explode. Then talk.", stream=True)
    )
    assert r.status == 500
    assert (await r.json())["error"]["code"] == "engine_error"
    # A later sentence fails: the stream is cut before its last chunk, so the client can tell.
    r = await client.post(
        "/v1/audio/speech", json=body(input="We talk. Then explode.", stream=True)
    )
    assert r.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await r.read()
    assert metrics.registry.get_sample_value("voxgate_streams_total", {"outcome": "failed"}) == 1
    # The server goes on serving, and the good sentence was cached for next time.
    ok = await client.post("/v1/audio/speech", json=body(input="We talk."))
    assert ok.status == 200
    assert ok.headers["X-Cache"] == "HIT"


async def test_a_miss_streams_by_default_only_with_several_sentences(
    gateway: GatewayFactory,
) -> None:
    """A body without ``stream``: several sentences stream; a text that splits into one (here
    not one sentence on its face: the check before splitting cannot tell) is answered whole,
    with its Content-Length and ETag."""
    client = await gateway()
    plain = {"model": "tts-1", "voice": "alloy", "response_format": "pcm"}
    several = await client.post("/v1/audio/speech", json={**plain, "input": FIVE})
    assert several.status == 200 and several.headers["X-Cache"] == "MISS"
    assert several.headers["Transfer-Encoding"] == "chunked"
    assert "Content-Length" not in several.headers and "ETag" not in several.headers
    assert len(await several.read()) > 0
    one = await client.post("/v1/audio/speech", json={**plain, "input": "Caf\u00e9 opens at 9."})
    assert one.status == 200 and one.headers["X-Cache"] == "MISS"
    assert one.headers["Content-Length"] == str(len(await one.read()))
    assert "ETag" in one.headers
