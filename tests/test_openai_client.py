"""The official OpenAI Python client against the gateway: plain, aac, and streamed speech."""

from __future__ import annotations

import subprocess
from pathlib import Path

from openai import AsyncOpenAI

from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

TEXT = "Thanks for waiting. An agent will be with you shortly."


async def test_openai_client_plain_and_streamed(
    gateway: GatewayFactory, counting_engine: CountingEngine, tmp_path: Path
) -> None:
    client = await gateway()
    base = str(client.make_url("/v1"))
    async with AsyncOpenAI(base_url=base, api_key=canary("client"), max_retries=0) as oa:
        plain = await oa.audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="aac"
        )
        aac = plain.content
        async with oa.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="wav", stream_format="audio"
        ) as resp:
            assert resp.headers["transfer-encoding"] == "chunked"
            chunks = [c async for c in resp.iter_bytes()]
    assert counting_engine.items == 2  # two sentences, once for both requests
    assert codec(tmp_path / "a.aac", aac) == "aac"
    assert codec(tmp_path / "s.wav", b"".join(chunks)) == "pcm_s16le"


def codec(path: Path, data: bytes) -> str:
    """The codec ffprobe finds in ``data``."""
    path.write_bytes(data)
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name",
            "-of",
            "csv=p=0",
            str(path),
        ],
        capture_output=True,
        check=True,
        text=True,
    )
    return out.stdout.strip()
