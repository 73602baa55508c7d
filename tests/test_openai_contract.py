"""OpenAI's speech contract, exactly: 24 kHz `pcm`, `instructions` accepted and ignored, fields of
later API versions ignored (each named in X-Ignored-Fields, or a 400 when strict),
`stream_format: "sse"`, and the listings OpenAI-style clients read."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from gateway.runtime.settings import Settings
from metrics import Metrics
from synth.piper_engine import PiperEngine
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, error_of
from tests.test_streaming import FailingEngine

THREE = "Your balance is ten dollars. Press one to pay it now. Press two for an agent."


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "tts-1", "voice": "alloy", "input": "Thank you for calling.", **kw}


def wav_seconds(data: bytes) -> float:
    info = sf.info(io.BytesIO(data))
    return float(info.frames) / float(info.samplerate)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of a text/event-stream body (``data:`` lines, blank-line separated)."""
    events = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block[:40]
            events.append(json.loads(block.removeprefix("data: ")))
    return events


async def test_pcm_is_24khz_unless_a_rate_is_asked(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    wav = await client.post("/v1/audio/speech", json=body(response_format="wav"))
    seconds = wav_seconds(await wav.read())
    assert wav.headers["X-Audio-Sample-Rate"] == "22050"  # the voice's own rate
    pcm = await client.post("/v1/audio/speech", json=body(response_format="pcm"))
    assert pcm.headers["X-Audio-Sample-Rate"] == "24000"
    # Played as OpenAI's 24 kHz s16le, it lasts as long as the WAV (a 22,050 Hz body would
    # play 8% short).
    assert abs(len(await pcm.read()) / 2 / 24000 - seconds) / seconds < 0.01
    asked = await client.post(
        "/v1/audio/speech", json=body(response_format="pcm", sample_rate=16000)
    )
    assert asked.headers["X-Audio-Sample-Rate"] == "16000"
    assert abs(len(await asked.read()) / 2 / 16000 - seconds) / seconds < 0.01
    assert counting_engine.items == 1  # every length is one master's: transcodes, not syntheses
    listing = await (await client.get("/v1/voices")).json()
    assert listing["formats"]["pcm"]["default_sample_rate"] == 24000
    assert listing["formats"]["wav"]["default_sample_rate"] is None


async def test_instructions_are_ignored_and_keep_the_content_address(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    plain = await client.post("/v1/audio/speech", json=body(response_format="wav"))
    assert "X-Ignored-Fields" not in plain.headers
    told = await client.post(
        "/v1/audio/speech",
        json=body(response_format="wav", instructions="Speak like a pirate."),
    )
    assert told.status == 200
    assert told.headers["X-Ignored-Fields"] == "instructions"
    assert told.headers["X-Audio-Key"] == plain.headers["X-Audio-Key"]
    assert await told.read() == await plain.read()
    assert told.headers["X-Cache"] == "HIT"
    assert counting_engine.items == 1
    # An empty instruction is no instruction.
    empty = await client.post("/v1/audio/speech", json=body(response_format="wav", instructions=""))
    assert "X-Ignored-Fields" not in empty.headers


@pytest.mark.parametrize(
    ("strict", "field", "value", "words"),
    [
        (
            "strict_instructions",
            "instructions",
            "Whisper.",
            "model 'piper' does not follow 'instructions'",
        ),
        ("strict_fields", "colour", "blue", "unrecognized request argument: colour"),
    ],
)
async def test_a_strict_setting_restores_the_400(
    gateway: GatewayFactory, settings: Settings, strict: str, field: str, value: str, words: str
) -> None:
    """What is followed or ignored by default is refused, naming the field, when asked."""
    client = await gateway(settings=settings.replace(**{strict: True}))
    r = await client.post("/v1/audio/speech", json=body(**{field: value}))
    err = await error_of(r, 400)
    assert err["param"] == field
    assert words in err["message"]


async def test_unknown_fields_are_ignored_and_named(gateway: GatewayFactory) -> None:
    client = await gateway()
    plain = await client.post("/v1/audio/speech", json=body(response_format="wav"))
    r = await client.post(
        "/v1/audio/speech",
        json=body(response_format="wav", include=["logprobs"], voice_settings={"x": 1}),
    )
    assert r.status == 200
    assert r.headers["X-Ignored-Fields"] == "include, voice_settings"
    assert r.headers["X-Audio-Key"] == plain.headers["X-Audio-Key"]
    # A field name is echoed only when it is a plain token: never a CR/LF into a header.
    odd = await client.post(
        "/v1/audio/speech", json=body(response_format="wav", **{"x\r\nSet-Cookie: a=b": 1})
    )
    assert odd.status == 200
    assert odd.headers["X-Ignored-Fields"] == "1 more"
    assert "Set-Cookie" not in odd.headers


async def test_sse_deltas_are_the_pcm_body(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    r = await client.post(
        "/v1/audio/speech", json=body(input=THREE, response_format="pcm", stream_format="sse")
    )
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["X-Cache"] == "MISS"
    events = sse_events(await r.read())
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(events) >= 4  # at least one delta per sentence, then done
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_characters"] == len(THREE) == usage["input_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert counting_engine.items == 3

    # The same request whole: the rendition the stream's production stores (joined while it
    # finishes, or read once stored), made from the same sentences: no synthesis.
    whole = await client.post("/v1/audio/speech", json=body(input=THREE, response_format="pcm"))
    assert whole.headers["X-Audio-Key"] == r.headers["X-Audio-Key"]
    stored = await whole.read()
    assert counting_engine.items == 3
    # Each sentence (and pause) is resampled on its own when streamed, the whole at once when
    # stored: the lengths differ by the rounding of each, at most a sample per part.
    assert abs(len(streamed) - len(stored)) <= 2 * 6
    assert abs(usage["audio_seconds"] - len(stored) / 2 / 24000) < 0.005
    a = np.frombuffer(streamed, dtype="<i2").astype(np.float64)
    b = np.frombuffer(stored, dtype="<i2").astype(np.float64)
    n = min(len(a), len(b))
    assert np.corrcoef(a[:n], b[:n])[0, 1] > 0.98

    # Stored audio goes out at once, and its deltas are exactly the stored bytes.
    again = await client.post(
        "/v1/audio/speech", json=body(input=THREE, response_format="pcm", stream_format="sse")
    )
    assert again.headers["X-Cache"] == "HIT"
    events = sse_events(await again.read())
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == stored
    assert counting_engine.items == 3


async def test_sse_streams_other_formats(gateway: GatewayFactory) -> None:
    client = await gateway()
    r = await client.post(
        "/v1/audio/speech", json=body(input=THREE, response_format="wav", stream_format="sse")
    )
    events = sse_events(await r.read())
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert data[:4] == b"RIFF" and data[36:40] == b"data"  # a 44-byte header, then samples
    rate = int.from_bytes(data[24:28], "little")
    # The usage says how long the audio sent is (not a guess at a random synthesis's length).
    assert abs(events[-1]["usage"]["audio_seconds"] - (len(data) - 44) / 2 / rate) < 0.005


async def test_listings(gateway: GatewayFactory) -> None:
    client = await gateway()
    models = await (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    ids = {m["id"] for m in models["data"]}
    assert {"piper", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= ids
    assert all(m["object"] == "model" and "owned_by" in m for m in models["data"])
    audio_models = await (await client.get("/v1/audio/models")).json()
    assert {m["id"] for m in audio_models["models"]} == ids
    voices = await (await client.get("/v1/audio/voices")).json()
    by_id = {v["id"]: v for v in voices["voices"]}
    assert by_id["joe"]["name"] == "joe"
    assert by_id["alloy"]["name"] == "alloy (joe)"
    # Every listed voice is one /v1/audio/speech accepts.
    for vid in list(by_id)[:3]:
        r = await client.post("/v1/audio/speech", json=body(voice=vid, response_format="wav"))
        assert r.status == 200, vid


async def test_sse_failure_after_the_first_event(
    gateway: GatewayFactory, piper_engine: PiperEngine, metrics: Metrics
) -> None:
    """A sentence that fails after the first delta: an error event, then the connection is cut
    before the stream's end (no speech.audio.done), so no client takes the audio as complete."""
    client = await gateway(engines={"piper": FailingEngine(piper_engine)})
    r = await client.post(
        "/v1/audio/speech",
        json=body(input="We talk. Then explode.", response_format="pcm", stream_format="sse"),
    )
    assert r.status == 200
    received = bytearray()
    with pytest.raises(aiohttp.ClientPayloadError):
        async for chunk in r.content.iter_any():
            received += chunk
    events = sse_events(bytes(received))
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error"
    assert "speech.audio.done" not in {e["type"] for e in events}
    assert metrics.registry.get_sample_value("voxgate_streams_total", {"outcome": "failed"}) == 1
    # Failing before the first event is still a plain JSON error.
    r = await client.post(
        "/v1/audio/speech",
        json=body(input="We explode.", stream_format="sse", response_format="pcm"),
    )
    assert (await error_of(r, 500))["code"] == "engine_error"
