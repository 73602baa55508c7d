"""The compatible endpoints, called the way their clients call them: Coqui tts-server's /api/tts
(its web page and scripts) and the plain GET /synthesize."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
import soundfile as sf

from tests.conftest import GatewayFactory
from tests.support import CountingEngine, error_of, shortest_audio_s

TEXT = "Your appointment is confirmed."


async def test_coqui_web_page_query(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    # Coqui's index.html: fetch('/api/tts?text=...&speaker_id=&style_wav=&language_id=')
    r = await client.get(
        "/api/tts", params={"text": TEXT, "speaker_id": "", "style_wav": "", "language_id": ""}
    )
    assert r.status == 200, await r.text()
    assert r.headers["Content-Type"] == "audio/wav"
    pcm, rate = sf.read(io.BytesIO(await r.read()))
    assert rate == 22050
    assert len(pcm) / rate >= shortest_audio_s(TEXT)
    # The same request in OpenAI's shape is the same cache entry.
    r2 = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "wav"},
    )
    assert r2.headers["X-Audio-Key"] == r.headers["X-Audio-Key"]
    assert r2.headers["X-Cache"] == "HIT"
    assert counting_engine.items == 1


async def test_coqui_post_form_and_headers(gateway: GatewayFactory) -> None:
    client = await gateway()
    form = await client.post("/api/tts", data={"text": TEXT, "speaker_id": "joe"})
    assert form.status == 200, await form.text()
    header = await client.post("/api/tts", headers={"text": TEXT, "speaker-id": "joe"})
    assert header.status == 200, await header.text()
    assert header.headers["X-Audio-Key"] == form.headers["X-Audio-Key"]
    lang = await client.get("/api/tts", params={"text": TEXT, "language_id": "en"})
    assert lang.status == 200
    assert lang.headers["X-Audio-Key"] == form.headers["X-Audio-Key"]


@pytest.mark.parametrize(
    ("params", "param", "words"),
    [
        ({"text": TEXT, "emotion": "happy"}, "emotion", "unsupported field emotion"),
        ({"text": TEXT, "style_wav": '{"0": 0.3}'}, "style_wav", "not supported"),
        ({"text": TEXT, "speaker_wav": "/tmp/me.wav"}, "speaker_wav", "not supported"),
        ({"text": TEXT, "language_id": "de"}, "language_id", "speaks en_US"),
        ({"text": TEXT, "speaker_id": "nobody"}, "speaker_id", "unknown voice"),
        ({"text": "   "}, "text", "empty"),
        ({}, "text", "empty"),
    ],
)
async def test_coqui_unsupported_input_is_a_400_that_says_so(
    gateway: GatewayFactory, params: dict[str, str], param: str, words: str
) -> None:
    client = await gateway()
    r = await client.get("/api/tts", params=params)
    err = await error_of(r, 400)
    assert err["param"] == param
    assert words in err["message"]


async def test_synthesize_query_string(gateway: GatewayFactory, caplog: Any) -> None:
    client = await gateway()
    secret = "My account number is 99 88 77."
    # Every voxgate logger at DEBUG, the rest at INFO as `voxgate serve` sets them (piper-tts logs
    # request text at DEBUG; the CLI keeps it at INFO).
    caplog.set_level(logging.INFO)
    with caplog.at_level(logging.DEBUG, logger="voxgate"):
        r = await client.get(
            "/synthesize",
            params={"text": secret, "speaker": "joe", "model": "piper", "format": "mulaw"},
        )
    assert r.status == 200, await r.text()
    data = await r.read()
    info = sf.info(io.BytesIO(data))
    assert (info.samplerate, info.subtype) == (8000, "ULAW")
    # Query strings carry the text: it must not reach any log line.
    assert "99 88 77" not in caplog.text
    assert "account" not in caplog.text
    defaults = await client.get("/synthesize", params={"text": secret})
    assert defaults.headers["Content-Type"] == "audio/wav"
    r8k = await client.get("/synthesize", params={"text": secret, "sample_rate": "16000"})
    assert r8k.headers["X-Audio-Sample-Rate"] == "16000"
    etag = defaults.headers["ETag"]
    again = await client.get(
        "/synthesize", params={"text": secret}, headers={"If-None-Match": etag}
    )
    assert again.status == 304


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"text": TEXT, "voice": "joe"}, "voice"),
        ({"text": TEXT, "format": "wma"}, "format"),
        ({"text": TEXT, "model": "nope"}, "model"),
        ({"text": TEXT, "speaker": "nobody"}, "speaker"),
        ({"text": TEXT, "sample_rate": "fast"}, "sample_rate"),
        ({"text": TEXT, "sample_rate": "4000"}, "sample_rate"),
        ({"text": TEXT, "speed": "9"}, "speed"),
        ({"speaker": "joe"}, "text"),
    ],
)
async def test_synthesize_bad_input(
    gateway: GatewayFactory, params: dict[str, str], param: str
) -> None:
    client = await gateway()
    r = await client.get("/synthesize", params=params)
    assert (await error_of(r, 400))["param"] == param


def test_cli_logging_keeps_piper_text_out_at_debug() -> None:
    from gateway.cli.common import setup_logging as _setup_logging

    piper = logging.getLogger("piper")
    before = piper.level
    try:
        _setup_logging("debug")
        assert not piper.isEnabledFor(logging.DEBUG)
    finally:
        piper.setLevel(before)
