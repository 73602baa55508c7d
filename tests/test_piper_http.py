"""Piper's HTTP API (``POST /``, ``GET /voices``), as OHF-Voice/piper1-gpl's docs/API_HTTP.md and
src/piper/http_server.py define it: a JSON body ``{text, voice, speaker, speaker_id,
length_scale, noise_scale, noise_w_scale}`` answered with WAV at the voice's rate; ``GET /voices``
answers ``{voice name: voice config}``."""

from __future__ import annotations

import io
from typing import Any

import soundfile as sf
from aiohttp.test_utils import TestClient

from tests.support import CountingEngine

TEXT = "Please hold while we connect you."


async def openai_key(client: Any, **kw: Any) -> str:
    r = await client.post(
        "/v1/audio/speech",
        json={"model": "piper", "voice": "joe", "input": TEXT, "response_format": "wav", **kw},
    )
    assert r.status == 200
    return str(r.headers["X-Audio-Key"])


async def test_post_root_answers_wav_from_the_same_cache(
    client: TestClient[Any, Any], counting_engine: CountingEngine
) -> None:
    r = await client.post("/", json={"text": TEXT})
    assert r.status == 200
    assert r.headers["Content-Type"] == "audio/wav"
    data = await r.read()
    info = sf.info(io.BytesIO(data))
    assert info.samplerate == 22050 and info.channels == 1 and info.subtype == "PCM_16"
    # Pipecat strips exactly 44 bytes of header from Piper's WAV: the header is the plain one.
    assert data[36:40] == b"data"
    # The same entry as OpenAI's endpoint for the same text and voice: one synthesis.
    assert r.headers["X-Audio-Key"] == await openai_key(client)
    named = await client.post("/", json={"text": TEXT, "voice": "joe", "speaker_id": 0})
    assert named.headers["X-Cache"] == "HIT"
    assert counting_engine.items == 1


async def test_length_scale_is_speed_and_noise_scales_are_in_the_key(
    client: TestClient[Any, Any], counting_engine: CountingEngine
) -> None:
    fast = await client.post("/", json={"text": TEXT, "length_scale": 0.5})
    assert fast.headers["X-Audio-Key"] == await openai_key(client, speed=2.0)
    default = await client.post("/", json={"text": TEXT})
    # The voice's own noise scales (joe: 0.667, 0.8) are the same audio: the same key.
    same = await client.post("/", json={"text": TEXT, "noise_scale": 0.667, "noise_w_scale": 0.8})
    assert same.headers["X-Audio-Key"] == default.headers["X-Audio-Key"]
    before = counting_engine.items
    calm = await client.post("/", json={"text": TEXT, "noise_scale": 0.0, "noise_w_scale": 0.0})
    assert calm.status == 200
    assert calm.headers["X-Audio-Key"] != default.headers["X-Audio-Key"]
    assert counting_engine.items == before + 1
    # The same asked parameters, in any order: the same entry.
    again = await client.post("/", json={"text": TEXT, "noise_w_scale": 0.0, "noise_scale": 0.0})
    assert again.headers["X-Cache"] == "HIT"


async def test_bad_piper_bodies(client: TestClient[Any, Any]) -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({}, "text", "missing"),
        ({"text": "Hi.", "voice": "nobody"}, "voice", "unknown voice 'nobody'"),
        ({"text": "Hi.", "speaker_id": 3}, "speaker_id", "one speaker"),
        ({"text": "Hi.", "speaker": "alice"}, "speaker", "one speaker"),
        ({"text": "Hi.", "length_scale": 9}, "length_scale", "between"),
        ({"text": "Hi.", "noise_scale": -1}, "noise_scale", "between"),
        ({"text": "Hi.", "rate": 3}, "rate", "unsupported field"),
    ]
    for payload, param, words in cases:
        r = await client.post("/", json=payload)
        assert r.status == 400, payload
        err = (await r.json())["error"]
        assert err["param"] == param, payload
        assert words in err["message"], err
    # GET / is not Piper's web page but voxgate's prompt studio; other methods are
    # 405, naming both.
    r = await client.get("/")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    r = await client.put("/")
    assert r.status == 405
    assert r.headers["Allow"] == "POST, GET, HEAD"


async def test_voices_listing(client: TestClient[Any, Any]) -> None:
    voices = await (await client.get("/voices")).json()
    joe = voices["joe"]
    assert joe["audio"]["sample_rate"] == 22050
    assert joe["language"]["code"] == "en_US"
    assert joe["num_speakers"] == 1
    assert joe["inference"]["noise_scale"] == 0.667
