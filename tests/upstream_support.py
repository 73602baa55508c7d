"""A local TTS provider for the upstream tests: OpenAI's published speech contract on loopback.

:class:`OpenAISpeechServer` answers ``POST /v1/audio/speech`` as OpenAI's OpenAPI document says
the endpoint behaves (the public repository openai/openai-openapi, ``openapi.yaml`` at commit
f85dbe223d40e1a31cba812ab2d755c7e98a92a3: the ``createSpeech`` operation, the
``CreateSpeechRequest`` schema, the ``TooManyRequests`` response and the ``ErrorResponse`` /
``Error`` schemas):

- ``Authorization: Bearer <key>`` (the ``ApiKeyAuth`` scheme: http bearer); 401 otherwise;
- a JSON body with ``additionalProperties: false``: ``model``, ``input`` (at most 4096
  characters), ``voice`` required; ``instructions`` (at most 4096), ``response_format`` (``mp3``,
  ``opus``, ``aac``, ``flac``, ``wav``, ``pcm``; default ``mp3``), ``speed`` (0.25-4, default 1),
  ``stream_format`` (``sse`` or ``audio``) optional; anything else a 400;
- errors as ``{"error": {"message", "type", "param", "code"}}``, all four present;
- 429 with a ``Retry-After`` header of whole seconds (minimum 1);
- the audio as ``application/octet-stream``; ``pcm`` is 24 kHz 16-bit little-endian mono without
  a header (OpenAI's text-to-speech guide), ``wav`` the same in a RIFF container.

Only ``pcm`` and ``wav`` are produced (what voxgate asks for); another format is answered 400 here,
so a test would see voxgate asking for something lossy. The speech is a tone whose pitch follows
the text and whose length follows its characters: deterministic, so equal bytes mean equal calls.
"""

from __future__ import annotations

import asyncio
import io
import json
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soundfile
from aiohttp import web

from bench.harness import free_port

RATE = 24000
# CreateSpeechRequest's properties, as the document lists them (additionalProperties: false).
PROPERTIES = {
    "model",
    "input",
    "instructions",
    "voice",
    "response_format",
    "speed",
    "stream_format",
}
REQUIRED = ("model", "input", "voice")
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


def tone(text: str, speed: float = 1.0) -> np.ndarray[Any, np.dtype[np.int16]]:
    """The "speech" of ``text``: 30 ms per character (over ``speed``), pitch from its CRC."""
    n = max(1, int(len(text) * 0.03 * RATE / speed))
    pitch = 200 + zlib.crc32(text.encode()) % 600
    t = np.arange(n, dtype=np.float64) / RATE
    return (np.sin(2 * np.pi * pitch * t) * 12000).astype("<i2")


def error(
    status: int, message: str, param: str | None = None, code: str | None = None, **headers: str
) -> web.Response:
    """An answer in the document's ErrorResponse shape."""
    kind = {401: "invalid_request_error", 429: "requests", 500: "server_error"}.get(
        status, "invalid_request_error"
    )
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


@dataclass
class Scripted:
    """An answer to give instead of audio: ``status`` with an error body and ``headers``."""

    status: int
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)


class OpenAISpeechServer:
    """The provider on a free loopback port; ``url`` is its base URL (``.../v1``).

    ``calls`` counts the requests that reached the speech route (each attempt, failures
    included); ``texts`` holds the ``input`` of each call answered with audio; ``script`` holds
    answers to give (in order) before audio; ``delay_s`` is the provider's latency;
    ``hold`` (when cleared) keeps every call waiting until it is set.
    """

    def __init__(
        self,
        *,
        api_key: str = "sk-test-key",
        voices: tuple[str, ...] = ("alloy", "nova", "coral"),
        delay_s: float = 0.0,
        port: int | None = None,
    ) -> None:
        self.api_key = api_key
        self.voices = voices
        self.delay_s = delay_s
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.calls = 0
        self.texts: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.script: deque[Scripted] = deque()
        self.hold = asyncio.Event()
        self.hold.set()
        self._runner: web.AppRunner | None = None

    async def start(self) -> OpenAISpeechServer:
        app = web.Application()
        app.router.add_post("/v1/audio/speech", self._speech)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        self.headers.append(dict(request.headers))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return error(401, "Incorrect API key provided.", code="invalid_api_key")
        if request.content_type != "application/json":
            return error(400, "Content-Type must be application/json")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return error(400, "We could not parse the JSON body of your request.")
        problem = self._invalid(body)
        if problem is not None:
            return problem
        self.bodies.append(body)
        await self.hold.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # the provider's latency
        if self.script:
            s = self.script.popleft()
            return error(s.status, s.message, **s.headers)
        self.texts.append(body["input"])
        samples = tone(body["input"], float(body.get("speed", 1)))
        fmt = body.get("response_format", "mp3")
        if fmt == "pcm":
            data = samples.tobytes()
        else:
            out = io.BytesIO()
            soundfile.write(out, samples, RATE, format="WAV", subtype="PCM_16")
            data = out.getvalue()
        return web.Response(body=data, content_type="application/octet-stream")

    def _invalid(self, body: Any) -> web.Response | None:
        """The document's CreateSpeechRequest checks; the 400 of the first that fails."""
        if not isinstance(body, dict):
            return error(400, "The body must be a JSON object.")
        extra = sorted(set(body) - PROPERTIES)
        if extra:
            return error(400, f"Unrecognized request argument supplied: {extra[0]}", extra[0])
        for name in REQUIRED:
            if name not in body:
                return error(400, f"Missing required parameter: '{name}'.", name)
        if not isinstance(body["input"], str) or len(body["input"]) > 4096:
            return error(400, "'input' must be a string of at most 4096 characters", "input")
        instructions = body.get("instructions")
        if instructions is not None and (
            not isinstance(instructions, str) or len(instructions) > 4096
        ):
            return error(400, "'instructions' is too long", "instructions")
        fmt = body.get("response_format", "mp3")
        if fmt not in FORMATS:
            return error(400, f"Invalid value: '{fmt}'.", "response_format")
        if fmt not in ("pcm", "wav"):
            return error(400, f"this test provider makes pcm and wav only, not {fmt}")
        speed = body.get("speed", 1)
        if not isinstance(speed, int | float) or not 0.25 <= speed <= 4:
            return error(400, "'speed' must be between 0.25 and 4.0", "speed")
        if body.get("stream_format", "audio") not in ("sse", "audio"):
            return error(400, "Invalid stream_format", "stream_format")
        if body["voice"] not in self.voices:
            return error(
                400,
                f"Invalid value for 'voice' = {body['voice']}. Supported values are: "
                + ", ".join(f"'{v}'" for v in self.voices),
                "voice",
            )
        return None


class ElevenLabsServer:
    """ElevenLabs' text-to-speech endpoint as its OpenAPI document publishes it (the official
    SDK generated from it: repository elevenlabs/elevenlabs-python,
    ``src/elevenlabs/text_to_speech/raw_client.py`` and
    ``types/text_to_speech_convert_request_output_format.py``):
    ``POST /v1/text-to-speech/{voice_id}``, query ``output_format`` (``pcm_<rate>`` among the
    listed rates), the key in ``xi-api-key``, JSON ``text`` (required), ``model_id``,
    ``voice_settings`` (``stability``, ``similarity_boost``, ``style``, ``use_speaker_boost``,
    ``speed``); a 422 in FastAPI's ``{"detail": [{"loc", "msg", "type"}]}`` shape for a body that
    does not validate, ``{"detail": {"status", "message"}}`` for other errors (401 for a bad key,
    404 for an unknown voice). ``pcm_<rate>`` is raw 16-bit mono at that rate."""

    RATES = (8000, 16000, 22050, 24000, 44100, 48000)
    SETTINGS = frozenset({"stability", "similarity_boost", "style", "use_speaker_boost", "speed"})

    def __init__(
        self, *, api_key: str = "xi-test-key", voices: tuple[str, ...] = ("21m00Tcm4TlvDq8ikWAM",)
    ) -> None:
        self.api_key = api_key
        self.voices = voices
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.calls = 0
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> ElevenLabsServer:
        app = web.Application()
        app.router.add_post("/v1/text-to-speech/{voice_id}", self._speech)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @staticmethod
    def _detail(status: int, code: str, message: str) -> web.Response:
        return web.json_response({"detail": {"status": code, "message": message}}, status=status)

    async def _speech(self, request: web.Request) -> web.Response:
        self.calls += 1
        if request.headers.get("xi-api-key") != self.api_key:
            return self._detail(401, "invalid_api_key", "Invalid API key")
        body = await request.json()
        voice = request.match_info["voice_id"]
        self.requests.append((voice, dict(request.query), body))
        problems = []
        if not isinstance(body.get("text"), str):
            problems.append({"loc": ["body", "text"], "msg": "Field required", "type": "missing"})
        settings = body.get("voice_settings", {})
        if not isinstance(settings, dict) or set(settings) - self.SETTINGS:
            problems.append(
                {
                    "loc": ["body", "voice_settings"],
                    "msg": "Extra inputs are not permitted",
                    "type": "extra_forbidden",
                }
            )
        fmt = request.query.get("output_format", "mp3_44100_128")
        if not fmt.startswith("pcm_") or int(fmt[4:]) not in self.RATES:
            problems.append(
                {
                    "loc": ["query", "output_format"],
                    "msg": "this test server makes pcm only",
                    "type": "enum",
                }
            )
        if problems:
            return web.json_response({"detail": problems}, status=422)
        if voice not in self.voices:
            return self._detail(
                404, "voice_not_found", f"A voice with the voice_id {voice} was not found."
            )
        rate = int(fmt[4:])
        speed = float(settings.get("speed", 1.0))
        samples = tone(body["text"], speed)
        # At the asked rate: the tone's length in seconds, resampled by repetition of the pattern.
        n = int(len(samples) * rate / RATE)
        pcm = np.resize(samples, n).astype("<i2")
        return web.Response(body=pcm.tobytes(), content_type="application/octet-stream")
