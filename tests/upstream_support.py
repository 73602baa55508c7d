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
so a test would see voxgate asking for something lossy. The speech is :func:`voiced`: a buzz in
syllables whose pitch follows the text and whose length follows its characters, deterministic,
so equal bytes mean equal calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import soundfile
from aiohttp import web
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import async_read_event, async_write_event
from wyoming.tts import Synthesize

from bench.harness import free_port
from synth.piper_engine import PiperVoiceFiles
from tests import canary
from tests.support import voiced

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


def split_samples(data: bytes, parts: int) -> list[bytes]:
    """16-bit ``data`` cut into ``parts`` pieces of whole samples."""
    n = len(data) // 2
    bounds = [k * n // parts * 2 for k in range(parts + 1)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


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
    """An answer to give instead of audio: ``status`` with an error body and ``headers``; with
    ``hang``, no answer at all (the call waits until the server stops)."""

    status: int
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False


# The environment variable upstream entries in tests name for the local provider's key.
KEY_ENV = "VOXGATE_TEST_UPSTREAM_KEY"
# The local OpenAI-compatible provider's key (each fake provider's key is a canary).
OPENAI_KEY = canary.canary("sk-openai")


class LoopbackProvider:
    """A provider's app on a free loopback port (``port``), answering POSTs to ``path`` with
    ``_handle``: the start and stop every fake provider here shares."""

    path = "/"

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._runner: web.AppRunner | None = None

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_post(self.path, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        canary.provider_ports.add(self.port)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            canary.provider_ports.discard(self.port)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError


class OpenAISpeechServer(LoopbackProvider):
    """The provider on a free loopback port; ``url`` is its base URL (``.../v1``).

    ``calls`` counts the requests that reached the speech route (each attempt, failures
    included); ``texts`` holds the ``input`` of each call answered with audio (``events``: each
    call's arrival and answer, in order); ``script`` holds
    answers to give (in order) before audio; ``takes`` holds 16-bit samples to answer (in
    order) instead of the text's own speech (a provider's bad takes); ``delay_s`` is the
    provider's latency;
    ``hold`` (when cleared) keeps every call waiting until it is set; a call whose ``input`` is
    in ``held_inputs`` waits until ``release`` is set.
    """

    path = "/v1/audio/speech"

    def __init__(
        self,
        *,
        api_key: str = OPENAI_KEY,
        voices: tuple[str, ...] = ("alloy", "nova", "coral"),
        delay_s: float = 0.0,
        port: int | None = None,
    ) -> None:
        self.api_key = api_key
        self.voices = voices
        self.delay_s = delay_s
        super().__init__(port)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.calls = 0
        self.texts: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        # ("received", input) and ("answered", input) of each call, in the order they happened.
        self.events: list[tuple[str, str]] = []
        self.headers: list[dict[str, str]] = []
        self.script: deque[Scripted] = deque()
        self.takes: deque[np.ndarray[Any, np.dtype[np.int16]]] = deque()
        self.hold = asyncio.Event()
        self.hold.set()
        self.held_inputs: set[str] = set()
        self.release = asyncio.Event()
        # In ``parts`` pieces: with ``parted`` set, each audio answer sets ``half_sent``, sends
        # every piece but the last, each in its own write, and the last once ``rest`` is set (a
        # provider that streams).
        self.parted = False
        self.parts = 2
        self.half_sent = asyncio.Event()
        self.rest = asyncio.Event()
        self._stopping = asyncio.Event()

    async def stop(self) -> None:
        self._stopping.set()
        await super().stop()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
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
        self.events.append(("received", body["input"]))
        await self.hold.wait()
        if body["input"] in self.held_inputs:
            await self.release.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # the provider's latency
        if self.script:
            s = self.script.popleft()
            if s.hang:
                await self._stopping.wait()
            return error(s.status, s.message, **s.headers)
        self.texts.append(body["input"])
        self.events.append(("answered", body["input"]))
        samples = (
            self.takes.popleft()
            if self.takes
            else voiced(body["input"], float(body.get("speed", 1)))
        )
        fmt = body.get("response_format", "mp3")
        if fmt == "pcm":
            data = samples.tobytes()
        else:
            out = io.BytesIO()
            soundfile.write(out, samples, RATE, format="WAV", subtype="PCM_16")
            data = out.getvalue()
        if not self.parted:
            return web.Response(body=data, content_type="application/octet-stream")
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        pieces = split_samples(data, self.parts)
        self.half_sent.set()
        for piece in pieces[:-1]:
            await resp.write(piece)
        await self.rest.wait()
        await resp.write(pieces[-1])
        await resp.write_eof()
        return resp

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


class HeldWyomingServer:
    """A Wyoming TTS server on loopback (the protocol as the ``wyoming`` package defines its
    events: a ``synthesize`` event is answered ``audio-start``, ``audio-chunk``s, ``audio-stop``;
    an unknown voice an ``error`` event) that says :func:`tone` of the text at :data:`RATE` in
    ``parts`` chunks: it sets ``half_sent``, sends every chunk but the last, and the last once
    ``rest`` is set. ``calls`` counts the synthesize events; ``url`` is its ``tcp://`` address."""

    def __init__(
        self, *, voices: tuple[str, ...] = ("alloy",), parts: int = 4, rate: int = RATE
    ) -> None:
        self.voices = voices
        self.parts = parts
        # The rate its chunks state (the samples are the tone's at RATE whatever it says);
        # ``repeat`` times the tone is said (a runaway take).
        self.rate = rate
        self.repeat = 1
        self.port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.calls = 0
        self.half_sent = asyncio.Event()
        self.rest = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> HeldWyomingServer:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._connections.add(me)
        try:
            event = await async_read_event(reader)
            if event is None or not Synthesize.is_type(event.type):
                return
            self.calls += 1
            ask = Synthesize.from_event(event)
            voice = ask.voice.name if ask.voice is not None else None
            if voice not in self.voices:
                await async_write_event(Error(text=f"no voice {voice}").event(), writer)
                return
            form = {"rate": self.rate, "width": 2, "channels": 1}
            await async_write_event(AudioStart(**form).event(), writer)
            pieces = split_samples(voiced(ask.text).tobytes() * self.repeat, self.parts)
            self.half_sent.set()
            for piece in pieces[:-1]:
                await async_write_event(AudioChunk(audio=piece, **form).event(), writer)
            await self.rest.wait()
            await async_write_event(AudioChunk(audio=pieces[-1], **form).event(), writer)
            await async_write_event(AudioStop().event(), writer)
        finally:
            self._connections.discard(me)
            writer.close()


class ElevenLabsServer(LoopbackProvider):
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

    path = "/v1/text-to-speech/{voice_id}"
    RATES = (8000, 16000, 22050, 24000, 44100, 48000)
    SETTINGS = frozenset({"stability", "similarity_boost", "style", "use_speaker_boost", "speed"})

    def __init__(
        self,
        *,
        api_key: str = canary.canary("xi"),
        voices: tuple[str, ...] = ("21m00Tcm4TlvDq8ikWAM",),
    ) -> None:
        super().__init__()
        self.api_key = api_key
        self.voices = voices
        self.url = f"http://127.0.0.1:{self.port}"
        self.calls = 0
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    @staticmethod
    def _detail(status: int, code: str, message: str) -> web.Response:
        return web.json_response({"detail": {"status": code, "message": message}}, status=status)

    async def _handle(self, request: web.Request) -> web.Response:
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
        pcm = voiced(body["text"], speed, rate)  # made at the asked rate
        return web.Response(body=pcm.tobytes(), content_type="application/octet-stream")


class ContractServer(LoopbackProvider):
    """A provider's speech endpoint on loopback, as its published reference describes it (each
    subclass cites it): ``requests`` holds (path, query, headers, body) of each call; ``script``
    answers to give first, as (status, headers, body)."""

    def __init__(self, *, api_key: str, voices: tuple[str, ...]) -> None:
        super().__init__()
        self.api_key = api_key
        self.voices = voices
        self.url = f"http://127.0.0.1:{self.port}"
        self.calls = 0
        self.requests: list[tuple[str, dict[str, str], dict[str, str], bytes]] = []
        self.script: deque[tuple[int, dict[str, str], bytes]] = deque()

    async def _handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.read()
        self.requests.append((request.path, dict(request.query), dict(request.headers), body))
        if self.script:
            status, headers, data = self.script.popleft()
            return web.Response(status=status, headers=headers, body=data)
        return self.answer(request, body)

    def answer(self, request: web.Request, body: bytes) -> web.Response:
        raise NotImplementedError


class AzureServer(ContractServer):
    """Azure AI Speech's text to speech REST endpoint as Microsoft Learn's "Text to speech REST
    API" page describes it: ``POST /cognitiveservices/v1``; ``Ocp-Apim-Subscription-Key``
    (401 without the right one), ``Content-Type: application/ssml+xml``,
    ``X-Microsoft-OutputFormat`` (one of the listed formats; ``raw-*`` is headerless PCM) and
    ``User-Agent`` required (400 without); the body SSML with a ``voice`` element whose ``name``
    is a voice (400, empty body, for one it does not have)."""

    path = "/cognitiveservices/v1"
    RAW: ClassVar[dict[str, int]] = {
        "raw-8khz-16bit-mono-pcm": 8000,
        "raw-16khz-16bit-mono-pcm": 16000,
        "raw-22050hz-16bit-mono-pcm": 22050,
        "raw-24khz-16bit-mono-pcm": 24000,
        "raw-44100hz-16bit-mono-pcm": 44100,
        "raw-48khz-16bit-mono-pcm": 48000,
    }

    def __init__(self) -> None:
        super().__init__(api_key=canary.canary("azure"), voices=("en-US-AvaMultilingualNeural",))

    def answer(self, request: web.Request, body: bytes) -> web.Response:
        import xml.etree.ElementTree as ET

        h = request.headers
        if h.get("Ocp-Apim-Subscription-Key") != self.api_key:
            return web.Response(status=401)
        if h.get("Content-Type") != "application/ssml+xml" or not h.get("User-Agent"):
            return web.Response(status=400)
        rate = self.RAW.get(h.get("X-Microsoft-OutputFormat", ""))
        if rate is None:
            return web.Response(status=400)
        speak = ET.fromstring(body)
        voice = speak.find("voice")
        if speak.tag != "speak" or voice is None or voice.get("name") not in self.voices:
            return web.Response(status=400)
        text = "".join(voice.itertext())
        prosody = voice.find("prosody")
        speed = float(prosody.get("rate", "1")) if prosody is not None else 1.0
        samples = voiced(text, speed, rate)
        return web.Response(body=samples.astype("<i2").tobytes(), content_type="audio/x-wav")


class GoogleServer(ContractServer):
    """Google Cloud Text-to-Speech's ``text.synthesize`` as its v1 REST reference describes it:
    ``POST /v1/text:synthesize``; the API key in ``X-Goog-Api-Key``; JSON ``input`` (``text``),
    ``voice`` (``languageCode``, ``name``), ``audioConfig`` (``audioEncoding``,
    ``sampleRateHertz``, ``speakingRate``); the answer ``{"audioContent": base64}``, LINEAR16
    with its WAV header; errors ``{"error": {"code", "message", "status"}}``."""

    path = "/v1/text:synthesize"

    def __init__(self) -> None:
        super().__init__(api_key=canary.canary("google"), voices=("en-US-Neural2-F",))

    @staticmethod
    def _error(code: int, status: str, message: str) -> web.Response:
        body = {"error": {"code": code, "message": message, "status": status}}
        return web.json_response(body, status=code)

    def answer(self, request: web.Request, body: bytes) -> web.Response:
        import base64

        if request.headers.get("X-Goog-Api-Key") != self.api_key:
            return self._error(401, "UNAUTHENTICATED", "API key not valid.")
        value = json.loads(body)
        if set(value) - {"input", "voice", "audioConfig"} or "text" not in value.get("input", {}):
            return self._error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        voice, config = value.get("voice", {}), value.get("audioConfig", {})
        if voice.get("name") not in self.voices:
            return self._error(
                400, "INVALID_ARGUMENT", f"Voice '{voice.get('name')}' does not exist."
            )
        if config.get("audioEncoding") != "LINEAR16":
            return self._error(400, "INVALID_ARGUMENT", "this test server makes LINEAR16 only")
        rate = int(config.get("sampleRateHertz", RATE))
        speed = float(config.get("speakingRate", 1.0))
        samples = voiced(value["input"]["text"], speed, rate)
        out = io.BytesIO()
        soundfile.write(out, samples, rate, format="WAV", subtype="PCM_16")
        return web.json_response({"audioContent": base64.b64encode(out.getvalue()).decode()})


class DeepgramServer(ContractServer):
    """Deepgram's ``/v1/speak`` as its API reference ("Single Text Request") describes it:
    ``POST /v1/speak``; ``Authorization: Token <key>``; the query ``model`` (a voice such as
    ``aura-2-thalia-en``), ``encoding``, ``sample_rate``, ``container``; JSON ``{"text"}``;
    errors ``{"err_code", "err_msg", "request_id"}``."""

    path = "/v1/speak"

    def __init__(self) -> None:
        super().__init__(api_key=canary.canary("deepgram"), voices=("aura-2-thalia-en",))

    @staticmethod
    def _error(status: int, code: str, message: str) -> web.Response:
        body = {"err_code": code, "err_msg": message, "request_id": "test"}
        return web.json_response(body, status=status)

    def answer(self, request: web.Request, body: bytes) -> web.Response:
        if request.headers.get("Authorization") != f"Token {self.api_key}":
            return self._error(401, "INVALID_AUTH", "Invalid credentials.")
        q = request.query
        if q.get("model") not in self.voices:
            return self._error(400, "UNSUPPORTED_MODEL", f"No such model: {q.get('model')}")
        if (q.get("encoding"), q.get("container")) != ("linear16", "none"):
            return self._error(400, "UNSUPPORTED", "this test server makes raw linear16 only")
        rate = int(q.get("sample_rate", "24000"))
        value = json.loads(body)
        if set(value) != {"text"}:
            return self._error(400, "INVALID_BODY", 'The body must be {"text": ...}.')
        samples = voiced(value["text"], 1.0, rate)
        return web.Response(body=samples.tobytes(), content_type="audio/l16")


def sigv4_signature(
    secret: str,
    method: str,
    path: str,
    headers: dict[str, str],
    signed: list[str],
    body: bytes,
    amz_date: str,
    scope: str,
) -> str:
    """AWS Signature Version 4 of a request without a query, computed here from the published
    algorithm (AWS General Reference, "Create a signed AWS API request": canonical request,
    string to sign, the derived signing key), not by botocore: the check of voxgate's signing."""
    import hashlib
    import hmac

    lower = {k.lower(): v for k, v in headers.items()}
    canonical_headers = "".join(f"{h}:{' '.join(lower[h].split())}\n" for h in signed)
    canonical = "\n".join(
        [method, path, "", canonical_headers, ";".join(signed), hashlib.sha256(body).hexdigest()]
    )
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


class PollyServer(ContractServer):
    """Amazon Polly's SynthesizeSpeech as its service model publishes it (botocore's
    ``botocore/data/polly/2016-06-10/service-2.json``: protocol rest-json, signature v4, the
    ``SynthesizeSpeech`` operation, ``SynthesizeSpeechInput`` and its errors; the Amazon Polly API
    Reference, "SynthesizeSpeech"): ``POST /v1/speech``, signed with AWS Signature Version 4
    for service ``polly`` in the region (checked here by recomputing it: 403
    ``InvalidSignatureException`` otherwise, ``UnrecognizedClientException`` for an unknown key
    id); a JSON body of ``Text``, ``VoiceId``, ``OutputFormat`` (required), ``TextType``
    (``text``/``ssml``), ``SampleRate`` (a string: ``8000``/``16000`` for pcm), ``Engine``,
    ``LanguageCode``, ``LexiconNames``, ``SpeechMarkTypes``; errors as the status with
    ``x-amzn-ErrorType`` and ``{"message"}`` (``ValidationException`` for a voice outside the
    enum, ``InvalidSsmlException``, ``InvalidSampleRateException``); the audio ``audio/pcm`` with
    ``x-amzn-RequestCharacters``."""

    path = "/v1/speech"
    MEMBERS = frozenset(
        {
            "Engine",
            "LanguageCode",
            "LexiconNames",
            "OutputFormat",
            "SampleRate",
            "SpeechMarkTypes",
            "Text",
            "TextType",
            "VoiceId",
        }
    )
    ENGINES = ("standard", "neural", "long-form", "generative")

    def __init__(self, *, region: str = "us-east-1") -> None:
        super().__init__(api_key=canary.canary("polly"), voices=("Joanna", "Matthew"))
        self.key_id = "AKIDPOLLYTEST"
        self.region = region
        self.bodies: list[dict[str, Any]] = []

    @staticmethod
    def _error(status: int, code: str, message: str) -> web.Response:
        headers = {
            "x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/com.amazonaws.polly/"
        }
        return web.json_response({"message": message}, status=status, headers=headers)

    def _signature_problem(self, request: web.Request, body: bytes) -> web.Response | None:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return self._error(
                403, "MissingAuthenticationTokenException", "Missing Authentication Token"
            )
        fields = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 ") :].split(","))
        key_id, _, scope = fields["Credential"].partition("/")
        if key_id != self.key_id:
            return self._error(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        amz_date = request.headers.get("X-Amz-Date", "")
        signed = fields["SignedHeaders"].split(";")
        parts = scope.split("/")
        if (
            len(parts) != 4
            or parts[1:] != [self.region, "polly", "aws4_request"]
            or parts[0] != amz_date[:8]
            or not {"host", "x-amz-date"} <= set(signed)
        ):
            return self._error(
                403, "InvalidSignatureException", "Credential should be scoped correctly."
            )
        expected = sigv4_signature(
            self.api_key,
            request.method,
            request.path,
            dict(request.headers),
            signed,
            body,
            amz_date,
            scope,
        )
        if fields["Signature"] != expected:
            return self._error(
                403,
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided.",
            )
        return None

    def answer(self, request: web.Request, body: bytes) -> web.Response:
        import xml.etree.ElementTree as ET

        problem = self._signature_problem(request, body)
        if problem is not None:
            return problem
        try:
            value = json.loads(body)
        except ValueError:
            return self._error(400, "SerializationException", "Malformed JSON")
        self.bodies.append(value)
        extra = sorted(set(value) - self.MEMBERS)
        if extra:
            return self._error(400, "SerializationException", f"Unknown member {extra[0]}")
        for name in ("OutputFormat", "Text", "VoiceId"):
            if name not in value:
                return self._error(
                    400,
                    "ValidationException",
                    f"1 validation error detected: Value null at '{name[0].lower() + name[1:]}' "
                    "failed to satisfy constraint: Member must not be null",
                )
        if value["VoiceId"] not in self.voices:
            return self._error(
                400,
                "ValidationException",
                f"1 validation error detected: Value '{value['VoiceId']}' at 'voiceId' failed to "
                "satisfy constraint: Member must satisfy enum value set: ["
                + ", ".join(self.voices)
                + "]",
            )
        if value.get("Engine", "standard") not in self.ENGINES:
            return self._error(
                400, "ValidationException", "Value at 'engine' failed to satisfy constraint"
            )
        if value["OutputFormat"] != "pcm":
            return self._error(400, "ValidationException", "this test server makes pcm only")
        rate_text = value.get("SampleRate", "16000")
        if rate_text not in ("8000", "16000"):
            return self._error(
                400, "InvalidSampleRateException", f"Invalid sample rate: {rate_text}"
            )
        text, speed = value["Text"], 1.0
        if value.get("TextType", "text") == "ssml":
            try:
                speak = ET.fromstring(text)
            except ET.ParseError:
                return self._error(400, "InvalidSsmlException", "Invalid SSML request")
            if speak.tag != "speak":
                return self._error(400, "InvalidSsmlException", "Invalid SSML request")
            prosody = speak.find("prosody")
            if prosody is not None:
                speed = float(prosody.get("rate", "100%").rstrip("%")) / 100
            text = "".join(speak.itertext())
        elif value.get("TextType", "text") != "text":
            return self._error(
                400, "ValidationException", "Value at 'textType' failed to satisfy constraint"
            )
        rate = int(rate_text)
        samples = voiced(text, speed, rate)
        return web.Response(
            body=samples.tobytes(),
            content_type="audio/pcm",
            headers={"x-amzn-RequestCharacters": str(len(value["Text"]))},
        )


class CartesiaServer(ContractServer):
    """Cartesia's Text to Speech (Bytes) as its API reference publishes it (docs.cartesia.ai:
    "Text to Speech (Bytes)" for API version 2025-04-16, its OpenAPI ``TTSRequest``, and
    "API Errors"): ``POST /tts/bytes``; the key in ``X-API-Key``; ``Cartesia-Version`` one of
    ``2024-06-10``, ``2024-11-13``, ``2025-04-16`` (required); JSON ``model_id``, ``transcript``,
    ``voice`` (``{"mode": "id", "id"}``), ``output_format`` (``container`` ``raw``, ``encoding``
    ``pcm_s16le``/``pcm_f32le``/``pcm_mulaw``/``pcm_alaw``, ``sample_rate``) required;
    ``language``, ``generation_config`` (``speed``, ``volume``, ``emotion``), ``speed``,
    ``duration``, ``save``, ``pronunciation_dict_id`` optional; errors before version 2026-03-01
    as plain text ``Title: Message``."""

    path = "/tts/bytes"
    VERSIONS = ("2024-06-10", "2024-11-13", "2025-04-16")
    FIELDS = frozenset(
        {
            "model_id",
            "transcript",
            "voice",
            "output_format",
            "language",
            "generation_config",
            "speed",
            "duration",
            "save",
            "pronunciation_dict_id",
        }
    )
    RATES = (8000, 16000, 22050, 24000, 44100, 48000)

    def __init__(self) -> None:
        super().__init__(
            api_key=canary.canary("cartesia"), voices=("694f9389-aac1-45b6-b726-9d9369183238",)
        )
        self.bodies: list[dict[str, Any]] = []

    @staticmethod
    def _error(status: int, title: str, message: str) -> web.Response:
        return web.Response(status=status, text=f"{title}: {message}")

    def answer(self, request: web.Request, body: bytes) -> web.Response:
        if request.headers.get("X-API-Key") != self.api_key:
            return self._error(401, "Unauthorized", "Invalid API key")
        if request.headers.get("Cartesia-Version") not in self.VERSIONS:
            return self._error(400, "Bad Request", "Invalid or missing Cartesia-Version header")
        value = json.loads(body)
        self.bodies.append(value)
        extra = sorted(set(value) - self.FIELDS)
        missing = [
            f for f in ("model_id", "transcript", "voice", "output_format") if f not in value
        ]
        if extra or missing:
            return self._error(400, "Bad Request", f"invalid fields: {extra or missing}")
        voice, fmt = value["voice"], value["output_format"]
        if not isinstance(voice, dict) or voice.get("mode") != "id":
            return self._error(400, "Bad Request", "voice must be {mode: id, id}")
        if fmt.get("container") != "raw" or fmt.get("encoding") != "pcm_s16le":
            return self._error(400, "Bad Request", "this test server makes raw pcm_s16le only")
        if fmt.get("sample_rate") not in self.RATES:
            return self._error(400, "Bad Request", f"Invalid sample rate {fmt.get('sample_rate')}")
        if voice.get("id") not in self.voices:
            return self._error(404, "Not Found", f"Voice {voice.get('id')} not found")
        speed = float(value.get("generation_config", {}).get("speed", 1.0))
        rate = fmt["sample_rate"]
        samples = voiced(value["transcript"], speed, rate)
        return web.Response(body=samples.tobytes(), content_type="audio/pcm")


@contextlib.contextmanager
def local_tts_studio(directory: Path) -> Iterator[str]:
    """local-tts-studio (PyPI, MIT; an OpenAI-compatible speech API over Piper voices) serving
    the bundled joe voice (22,050 Hz) from a voices directory under ``directory``; its base URL.
    Its server takes the voice from its own settings: it ignores the request's voice and speed."""
    if importlib.util.find_spec("local_tts") is None:
        raise RuntimeError("local-tts-studio is not installed: pip install -e '.[dev]' installs it")
    data = directory / "local-tts"
    voices = data / "voices"
    voices.mkdir(parents=True)
    joe = PiperVoiceFiles.bundled_joe()
    for src in (joe.model_path, joe.config_path):
        (voices / src.name).write_bytes(src.read_bytes())
    (data / "settings.json").write_text(
        json.dumps({"api_default_voice": joe.model_path.stem, "device": "cpu"})
    )
    port = free_port()
    log_path = directory / "local-tts.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_tts.cli", "--port", str(port)],
        env={**os.environ, "LOCAL_TTS_DATA_DIR": str(data)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:  # until it answers its model list (it starts in about a second)
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(log_path.read_text()) from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def wav_header(rate: int, data_bytes: int, *, channels: int = 1, bits: int = 16) -> bytes:
    """A 44-byte PCM WAV header stating ``rate`` (whatever it is) and ``data_bytes`` of
    samples."""
    align = channels * bits // 8
    fmt = (
        (1).to_bytes(2, "little")
        + channels.to_bytes(2, "little")
        + rate.to_bytes(4, "little")
        + (rate * align).to_bytes(4, "little")
        + align.to_bytes(2, "little")
        + bits.to_bytes(2, "little")
    )
    return (
        b"RIFF"
        + min(36 + data_bytes, 0xFFFFFFFF).to_bytes(4, "little")
        + b"WAVEfmt "
        + (16).to_bytes(4, "little")
        + fmt
        + b"data"
        + data_bytes.to_bytes(4, "little")
    )


class AnswerServer:
    """A threaded server of OpenAI's speech route that answers 200 with what is no usable take,
    by the first part of its path (``{url}/{mode}/v1`` is an upstream's base URL):

    - ``html``: an HTML error page (``text/html``), ``json``: a JSON error (``application/json``);
    - ``onehz``: a 22 KB WAV whose header claims 1 Hz;
    - ``endless``: raw "pcm" that never ends (until the reader goes, or 256 MiB);
    - ``wavof``: the request passed to ``target`` (a real server) asking WAV whatever was asked,
      the WAV answered as it came (what wyoming-openai-gateway does); ``wavs`` keeps each.

    ``served`` counts the body bytes each mode wrote (the endless one's socket buffer is kept
    small, so what was written is near what its reader took); ``calls`` each mode's requests.
    It runs in its own threads: a module's tests share it whatever their event loops.
    """

    ENDLESS_LIMIT = 256 * 1024 * 1024

    def __init__(self, target: str = "") -> None:
        import http.server
        import threading

        self.target = target
        self.served: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.wavs: list[bytes] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test reads counts, not a log."""

            def do_POST(self) -> None:
                mode = self.path.strip("/").split("/")[0]
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.calls[mode] = owner.calls.get(mode, 0) + 1
                owner.answer(self, mode, json.loads(body or b"{}"))

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def base_url(self, mode: str) -> str:
        return f"{self.url}/{mode}/v1"

    def answer(self, handler: Any, mode: str, request: dict[str, Any]) -> None:
        """Answer ``request`` on ``handler`` as ``mode`` does."""
        import socket

        kind, body = "application/octet-stream", b""
        if mode == "html":
            kind = "text/html; charset=utf-8"
            body = b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1>" + b" " * 2000
            body += b"</body></html>"
        elif mode == "json":
            kind = "application/json"
            body = json.dumps({"error": {"message": "model overloaded"}}).encode()
        elif mode == "onehz":
            samples = voiced(str(request.get("input", "")))[:11000].tobytes()
            kind, body = "audio/wav", wav_header(1, len(samples)) + samples
        elif mode == "wavof":
            ask = json.dumps({**request, "response_format": "wav"}).encode()
            call = urllib.request.Request(
                f"{self.target}/audio/speech",
                data=ask,
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(call, timeout=60) as resp:
                kind, body = resp.headers.get("Content-Type", "audio/wav"), resp.read()
            self.wavs.append(body)
        handler.send_response(200)
        handler.send_header("Content-Type", kind)
        if mode != "endless":
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if mode != "endless":
            handler.wfile.write(body)
            self.served[mode] = self.served.get(mode, 0) + len(body)
            return
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        piece = voiced("an endless answer" * 20).tobytes()[: 64 * 1024]
        self.served.setdefault(mode, 0)
        try:
            while self.served[mode] < self.ENDLESS_LIMIT:
                handler.wfile.write(piece)
                self.served[mode] += len(piece)
        except OSError:  # the reader hung up: what it refused is not written
            return
