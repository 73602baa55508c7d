"""An unmodified OpenAI client works against voxgate by changing only its base URL."""

from __future__ import annotations

import io

import openai
import soundfile as sf

from tests.conftest import GatewayFactory
from tests.support import CountingEngine


async def test_openai_client_speech(gateway: GatewayFactory,
                                    counting_engine: CountingEngine) -> None:
    client = await gateway()
    base = str(client.make_url("/v1"))
    oa = openai.AsyncOpenAI(base_url=base, api_key="not-needed", max_retries=0)
    try:
        resp = await oa.audio.speech.create(model="tts-1", voice="nova",
                                            input="Hello from an OpenAI client.",
                                            response_format="wav")
        data, rate = sf.read(io.BytesIO(resp.content))
        assert rate == 22050 and len(data) / rate > 0.5
        assert resp.response.headers["x-cache"] == "MISS"
        # OpenAI's default format (mp3) when the client sends none
        mp3 = await oa.audio.speech.create(model="gpt-4o-mini-tts", voice="alloy",
                                           input="Hello from an OpenAI client.")
        assert mp3.response.headers["content-type"] == "audio/mpeg"
        assert mp3.response.headers["x-cache"] == "HIT"  # a transcode of the stored master
        data, _ = sf.read(io.BytesIO(mp3.content))
        assert len(data) > 0
        assert counting_engine.items == 1
        try:
            await oa.audio.speech.create(model="tts-1", voice="nova", input="   ")
        except openai.BadRequestError as exc:
            assert "empty" in str(exc)
        else:
            raise AssertionError("empty input accepted")
    finally:
        await oa.close()
