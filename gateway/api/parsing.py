"""Request parsing and validation: from raw HTTP bodies to a :class:`SpeechRequest` or a 4xx."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from cache.keys import normalize_text
from gateway.errors import BadRequest, PayloadTooLarge
from gateway.memo import BoundedMemo
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.service import SpeechService
from synth import audio

MIN_SPEED, MAX_SPEED = 0.25, 4.0
MIN_RATE, MAX_RATE = 8000, 48000

SPEECH_FIELDS = frozenset(
    {
        "model",
        "input",
        "voice",
        "response_format",
        "speed",
        "sample_rate",
        "stream",
        "stream_format",
        "instructions",
    }
)


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The raw body, bounded by ``max_bytes`` (413 beyond)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(
            f"request body too large: {request.content_length} bytes (limit {max_bytes})"
        )
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body too large (limit {max_bytes} bytes)") from exc
    return raw


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse ``raw`` as a JSON object, whatever Content-Type the client sent (curl's ``-d``
    sends form encoding; rejecting it would only confuse)."""
    if not raw.strip():
        raise BadRequest("request body is empty: send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 (byte {exc.start})") from exc
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body


async def read_json_object(request: web.Request, max_bytes: int) -> dict[str, Any]:
    """Read and parse the body as a JSON object."""
    return parse_json_object(await read_body(request, max_bytes))


class RequestMemo(BoundedMemo[bytes, tuple[SpeechRequest, bool]]):
    """Validated requests by their exact body bytes (bounded, oldest first out).

    Bots and IVR systems send the same few thousand bodies again and again; parsing, validating
    and normalizing them was a third of a cache hit's Python time. Validation depends only on the
    body and on settings and models fixed at start, so the same bytes always give the same
    request. Only valid requests are kept, and only small bodies.
    """

    def __init__(self, size: int = 4096, max_body: int = 8192) -> None:
        super().__init__(size)
        self.max_body = max_body

    def put(self, raw: bytes, req: tuple[SpeechRequest, bool]) -> None:
        """Remember ``req`` (request, stream) for ``raw`` (small bodies only)."""
        if len(raw) <= self.max_body:
            super().put(raw, req)


def _require_str(body: Mapping[str, Any], name: str) -> str:
    if name not in body or body[name] is None:
        raise BadRequest(f"missing required field '{name}'", param=name)
    value = body[name]
    if not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string", param=name)
    return value


def validate_text(raw: str, settings: Settings, param: str = "input") -> str:
    """Normalize ``raw``; reject empty, oversized or malformed Unicode input."""
    if len(raw) > settings.max_input_chars:
        raise BadRequest(
            f"'{param}' is {len(raw)} characters; the limit is {settings.max_input_chars}",
            param=param,
            code="input_too_long",
        )
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"'{param}' contains invalid Unicode (a lone surrogate)", param=param
        ) from exc
    text = normalize_text(raw)
    if not text:
        raise BadRequest(f"'{param}' is empty or whitespace only", param=param)
    return text


def resolve_model(name: str, settings: Settings, speech: SpeechService) -> str:
    """Our model name for ``name`` (an alias such as ``tts-1`` or a model name)."""
    resolved = settings.model_aliases.get(name, name)
    if resolved not in speech.models:
        known = sorted(set(speech.models) | set(settings.model_aliases))
        raise BadRequest(
            f"unknown model '{name}'; available: {', '.join(known)}",
            param="model",
            code="model_not_found",
        )
    return resolved


def resolve_voice(name: str, model: str, settings: Settings, speech: SpeechService) -> str:
    """Our voice name for ``name`` on ``model`` (an alias such as ``alloy`` or a voice name)."""
    voices = speech.models[model].voice_names()
    if name in voices:
        return name
    alias = settings.voice_aliases.get(name)
    if alias is not None and alias in voices:
        return alias
    if alias is not None and model != settings.default_model:
        # OpenAI voice names on a model that lacks the aliased voice: use its first voice.
        return voices[0]
    known = sorted(set(voices) | set(settings.voice_aliases))
    raise BadRequest(
        f"unknown voice '{name}' for model '{model}'; available: {', '.join(known)}",
        param="voice",
        code="voice_not_found",
    )


def resolve_format(name: str) -> audio.AudioFormat:
    """The output format called ``name``."""
    fmt = audio.FORMATS.get(name)
    if fmt is None:
        raise BadRequest(
            f"unsupported response_format '{name}'; supported: {', '.join(audio.FORMATS)}",
            param="response_format",
            code="unsupported_format",
        )
    return fmt


def parse_speed(value: Any) -> float:
    """A speed in [0.25, 4.0]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest("'speed' must be a number", param="speed")
    speed = float(value)
    if not math.isfinite(speed) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise BadRequest(
            f"'speed' must be between {MIN_SPEED} and {MAX_SPEED}, got {value}", param="speed"
        )
    return speed


def parse_sample_rate(value: Any) -> int | None:
    """An output sample rate in [8000, 48000] Hz, or None for the format's default."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("'sample_rate' must be an integer (Hz)", param="sample_rate")
    if not MIN_RATE <= value <= MAX_RATE:
        raise BadRequest(
            f"'sample_rate' must be between {MIN_RATE} and {MAX_RATE} Hz", param="sample_rate"
        )
    return value


def parse_openai_speech(
    body: Mapping[str, Any], settings: Settings, speech: SpeechService
) -> SpeechRequest:
    """Validate an OpenAI ``/v1/audio/speech`` body."""
    unknown = sorted(set(body) - SPEECH_FIELDS)
    if unknown:
        raise BadRequest(f"unrecognized request argument: {', '.join(unknown)}", param=unknown[0])
    model = resolve_model(_require_str(body, "model"), settings, speech)
    text = validate_text(_require_str(body, "input"), settings)
    voice = resolve_voice(_require_str(body, "voice"), model, settings, speech)
    fmt_name = body.get("response_format")
    if fmt_name is None:
        fmt_name = settings.default_format
    if not isinstance(fmt_name, str):
        raise BadRequest("'response_format' must be a string", param="response_format")
    fmt = resolve_format(fmt_name)
    speed = parse_speed(body.get("speed", 1.0))
    rate = parse_sample_rate(body.get("sample_rate"))
    parse_stream(body, fmt)
    if body.get("instructions"):
        raise BadRequest(
            f"model '{model}' does not follow 'instructions'; omit the field", param="instructions"
        )
    return SpeechRequest(
        text=text, model=model, voice=voice, fmt=fmt, speed=speed, sample_rate=rate
    )


def parse_stream(body: Mapping[str, Any], fmt: audio.AudioFormat) -> bool:
    """Whether the response streams: ``stream: true``, or OpenAI's ``stream_format: "audio"``.

    Only formats whose sentence chunks concatenate into one valid stream can stream.
    """
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", param="stream")
    stream_format = body.get("stream_format")
    if stream_format not in (None, "audio"):
        raise BadRequest(
            f"unsupported stream_format {stream_format!r}: only 'audio' is supported "
            "(server-sent events are not)",
            param="stream_format",
            code="unsupported_stream_format",
        )
    if stream_format == "audio" and stream is False:
        raise BadRequest("'stream_format' is 'audio' but 'stream' is false", param="stream")
    streaming = bool(stream) or stream_format == "audio"
    if streaming and not fmt.streamable:
        names = ", ".join(f.name for f in audio.FORMATS.values() if f.streamable)
        raise BadRequest(
            f"response_format '{fmt.name}' cannot be streamed; streamable formats: {names}",
            param="response_format",
            code="unsupported_format",
        )
    return streaming
