"""The real clients voice agents use, unmodified, against a live gateway on loopback (no network:
dummy API keys, base URLs pointing at the gateway).

Each test checks that the audio the client hands its caller lasts as long as the WAV rendering
of the same text, within 3%: a client that plays 22,050 Hz samples as OpenAI's 24 kHz (or the
reverse) is 8% off and fails. Both are encodings of the same two sentence masters (each test
checks that only two syntheses ran), never two random syntheses, so the comparison holds on
every run. The Wyoming client's test is in tests/test_wyoming.py.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf
from aiohttp.test_utils import TestClient
from openai import AsyncOpenAI

from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

TEXT = "Thanks for calling. Your order ships tomorrow morning."


async def wav_seconds(http: TestClient[Any, Any], text: str = TEXT) -> float:
    """The duration of the gateway's WAV rendering of ``text`` (the reference)."""
    r = await http.post(
        "/v1/audio/speech",
        json={"model": "piper", "voice": "joe", "input": text, "response_format": "wav"},
    )
    info = sf.info(io.BytesIO(await r.read()))
    return float(info.frames) / float(info.samplerate)


def close_to(seconds: float, reference: float) -> bool:
    return abs(seconds - reference) / reference < 0.03


async def test_openai_client_pcm_and_sse(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """The official ``openai`` client: raw PCM (played as 24 kHz) and server-sent events."""
    http = await gateway()
    reference = await wav_seconds(http)
    async with AsyncOpenAI(
        base_url=str(http.make_url("/v1")), api_key=canary("client"), max_retries=0
    ) as oa:
        pcm = await oa.audio.speech.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm"
        )
        assert close_to(len(pcm.content) / 2 / 24000, reference)
        async with oa.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts",
            voice="alloy",
            input=TEXT,
            response_format="pcm",
            stream_format="sse",
            instructions="Cheerful.",
        ) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-ignored-fields"] == "instructions"
            lines = [line async for line in resp.iter_lines()]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    audio = b"".join(
        base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"
    )
    assert events[-1]["type"] == "speech.audio.done"
    assert close_to(len(audio) / 2 / 24000, reference)
    assert counting_engine.items == 2  # the reference's two sentence masters, nothing more


async def test_openai_agents_sdk_tts_model(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """openai-agents' ``OpenAITTSModel`` (agents.voice): asks for ``pcm`` and always sends
    ``instructions`` (its default tells the model to read partial sentences as they are)."""
    from agents.voice import OpenAITTSModel, TTSModelSettings

    http = await gateway()
    reference = await wav_seconds(http)
    async with AsyncOpenAI(
        base_url=str(http.make_url("/v1")), api_key=canary("client"), max_retries=0
    ) as oa:
        model = OpenAITTSModel("gpt-4o-mini-tts", oa)
        settings = TTSModelSettings(voice="alloy")
        assert settings.instructions  # the SDK sends some: they must not be a 400
        chunks = [c async for c in model.run(TEXT, settings)]
    # The SDK hands out 16-bit samples and plays them at 24 kHz.
    audio = b"".join(chunks)
    assert close_to(len(audio) / 2 / 24000, reference)
    assert counting_engine.items == 2  # the WAV and the PCM share their sentence masters


async def collect_pipecat(service: Any, text: str) -> list[Any]:
    """Run a Pipecat TTS service in a pipeline (Pipecat's own test harness) on ``text``; the
    audio frames it pushes downstream."""
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.tests.utils import run_test

    down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame(text)], start_timeout=10)
    return [f for f in down if isinstance(f, TTSAudioRawFrame)]


def frames_seconds(frames: list[Any]) -> float:
    return sum(len(f.audio) / 2 / f.sample_rate / f.num_channels for f in frames)


async def test_pipecat_openai_tts_service(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """Pipecat's ``OpenAITTSService``: ``pcm`` played as 24 kHz frames."""
    from pipecat.services.openai.tts import OpenAITTSService

    http = await gateway()
    reference = await wav_seconds(http)
    service = OpenAITTSService(api_key=canary("client"), base_url=str(http.make_url("/v1")))
    frames = await collect_pipecat(service, TEXT)
    assert frames and {f.sample_rate for f in frames} == {24000}
    assert close_to(frames_seconds(frames), reference)
    assert counting_engine.items == 2


async def test_pipecat_piper_http_tts_service(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """Pipecat's ``PiperHttpTTSService`` against Piper's HTTP API (``POST /``): it strips a
    44-byte WAV header, reads the rate from it and resamples to the pipeline's rate."""
    from pipecat.services.piper.tts import PiperHttpTTSService

    http = await gateway()
    reference = await wav_seconds(http)
    base = str(http.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as session:
        service = PiperHttpTTSService(
            base_url=base,
            aiohttp_session=session,
            settings=PiperHttpTTSService.Settings(voice="joe"),
        )
        frames = await collect_pipecat(service, TEXT)
    assert frames
    assert close_to(frames_seconds(frames), reference)
    assert counting_engine.items == 2
    # No header bytes played as audio: the first samples are the voice's leading near-silence.
    first = np.frombuffer(frames[0].audio[:200], dtype="<i2")
    assert np.abs(first).max() < 2000


async def test_livekit_openai_tts_plugin(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture, counting_engine: CountingEngine
) -> None:
    """LiveKit Agents' OpenAI TTS plugin: for a model other than tts-1 it asks for
    ``stream_format: "sse"`` (MP3 deltas, decoded to 24 kHz frames); for tts-1, streamed audio.
    Each answer's X-Request-Id becomes the utterance's request id (without one, the plugin
    warns "no request_id provided" on every utterance)."""
    from livekit.plugins import openai as lk_openai

    caplog.set_level(logging.WARNING)
    http = await gateway()
    reference = await wav_seconds(http)
    ids: list[str] = []
    for model, fmt in (("gpt-4o-mini-tts", "mp3"), ("tts-1", "pcm")):
        tts = lk_openai.TTS(
            model=model,
            voice="alloy",
            base_url=str(http.make_url("/v1")),
            api_key=canary("client"),
            response_format=fmt,
        )
        try:
            async with tts.synthesize(TEXT) as stream:
                events = [event async for event in stream]
                frames = [event.frame for event in events]
                ids.extend({event.request_id for event in events})
        finally:
            await tts.aclose()
        seconds = sum(f.samples_per_channel / f.sample_rate for f in frames)
        assert frames and {f.sample_rate for f in frames} == {24000}
        # MP3 adds its encoder delay and padding (tens of ms): still well within 3%.
        assert close_to(seconds, reference), (model, seconds, reference)
    assert len(ids) == 2 and len(set(ids)) == 2 and "unknown" not in ids and "" not in ids
    assert not [r for r in caplog.records if "request_id" in r.getMessage()], caplog.text
    assert counting_engine.items == 2
