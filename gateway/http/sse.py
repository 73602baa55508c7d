"""OpenAI's ``stream_format: "sse"``: speech as server-sent events.

The events, their order and ``usage``: docs/api.md, "Streaming" (server-sent events). OpenAI's
speech events carry no ``event:`` line: their ``type`` field names them.

Shapes from OpenAI's API reference (``SpeechAudioDeltaEvent``, ``SpeechAudioDoneEvent``) and what
the clients parse: LiveKit's OpenAI plugin reads ``data:`` lines, ``type``, ``audio`` and
``usage.input_tokens``/``output_tokens``. A failure after the first event cannot change the
status: an error event is sent and the connection dropped (docs/api.md), like a failed audio stream.

The OpenAPI document describes each event (``itemSchema``) from the types below.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Annotated, Any, Literal, cast, get_args

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from cache.entry import Entry
from gateway.errors import VoxgateError
from gateway.http import keys
from gateway.http.connections import write_within
from gateway.http.errors import ErrorObject, error_object, from_synthesis_error
from gateway.http.marks import SpeechMark
from gateway.speech import marks as speech_marks
from gateway.speech.assembly import SpeechStream
from gateway.speech.marks import Mark
from synth.errors import SynthesisError

log = logging.getLogger("voxgate.gateway")

# Bytes of audio per delta event: a stored rendition (or a long sentence) goes out in pieces of
# this size (even: 16-bit PCM samples are never split across events).
DELTA_BYTES = 32 * 1024
CONTENT_TYPE = "text/event-stream"


class Usage(TypedDict):
    """OpenAI's usage, and voxgate's own measures. The served engines have no tokens: input
    tokens count the input's characters, output tokens are 0."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_characters: int
    audio_seconds: Annotated[float, Field(description="The audio's length.")]


class SpeechAudioDeltaEvent(TypedDict):
    """A piece of the audio, in order: the deltas joined are the audio stream."""

    type: Literal["speech.audio.delta"]
    audio: Annotated[str, Field(description="Base64 of the audio's bytes in the asked format.")]


class SpeechMarksDeltaEvent(TypedDict):
    """The speech marks of the audio deltas that follow it, up to the next marks event (voices
    with speech marks only: docs/speech-marks.md)."""

    type: Literal["speech.marks.delta"]
    marks: Annotated[
        list[SpeechMark],
        Field(description="Polly's speech marks; `time` in ms from the start of the audio."),
    ]


class SpeechAudioDoneEvent(TypedDict):
    """The last event of a complete stream."""

    type: Literal["speech.audio.done"]
    usage: Usage


class SpeechErrorEvent(TypedDict):
    """A failure after the first event; the connection is dropped after it (no done event)."""

    type: Literal["error"]
    error: ErrorObject


SpeechEvent = (
    SpeechAudioDeltaEvent | SpeechMarksDeltaEvent | SpeechAudioDoneEvent | SpeechErrorEvent
)
EVENTS: tuple[type, ...] = get_args(SpeechEvent)


def event(payload: SpeechEvent) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def deltas(data: bytes, marks: list[Mark] | None = None) -> Iterator[bytes]:
    """``speech.audio.delta`` events for ``data``, in pieces of at most :data:`DELTA_BYTES`,
    after a ``speech.marks.delta`` event of its ``marks`` (when there are any)."""
    if marks:
        listed = cast(list[SpeechMark], [m.as_json() for m in marks])
        yield event({"type": "speech.marks.delta", "marks": listed})
    for start in range(0, len(data), DELTA_BYTES):
        piece = base64.b64encode(data[start : start + DELTA_BYTES]).decode("ascii")
        yield event({"type": "speech.audio.delta", "audio": piece})


def done(characters: int, audio_s: float) -> bytes:
    """The final ``speech.audio.done`` event with its usage."""
    usage: Usage = {
        "input_tokens": characters,
        "output_tokens": 0,
        "total_tokens": characters,
        "input_characters": characters,
        "audio_seconds": round(audio_s, 3),
    }
    return event({"type": "speech.audio.done", "usage": usage})


def error_event(exc: Exception) -> bytes:
    """The ``error`` event for a failure after the first event: OpenAI's error object, its type
    and code those the failure would have had as a JSON answer."""
    known = from_synthesis_error(exc) if isinstance(exc, SynthesisError) else VoxgateError("")
    error = error_object("synthesis failed mid-stream", known.type, code=known.code)
    return event({"type": "error", "error": error})


async def open_stream(
    request: web.Request, headers: dict[str, str], content_type: str | None = None
) -> web.StreamResponse:
    """Send the headers of a chunked answer (``content_type``, when given, replacing the
    audio's) that no cache keeps: its bytes are not the stored rendition's, so it carries no
    ETag (X-Audio-Key names the stored audio for a later GET)."""
    headers = {**headers, "Cache-Control": "no-store"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    resp = web.StreamResponse(headers=headers)
    resp.enable_chunked_encoding()
    request[keys.FIRST_BYTE_AT] = time.perf_counter()
    await resp.prepare(request)
    return resp


async def send_whole(
    request: web.Request,
    headers: dict[str, str],
    entry: Entry,
    *,
    characters: int,
    marks: bool = False,
) -> web.StreamResponse:
    """Stored audio as events: its marks (with ``marks``), every delta at once, then done."""
    resp = await open_stream(request, headers, CONTENT_TYPE)
    timeout_s = request.app[keys.SETTINGS].write_timeout_s
    try:
        found = speech_marks.from_ndjson(entry.meta.marks) if marks and entry.meta.marks else None
        for chunk in deltas(entry.audio, found):
            await write_within(request, resp, chunk, timeout_s)
        await write_within(request, resp, done(characters, entry.meta.duration_s), timeout_s)
        await resp.write_eof()
    except ConnectionResetError:
        log.info("event stream ended by the client")
    return resp


async def send_stream(
    request: web.Request,
    headers: dict[str, str],
    stream: SpeechStream,
    *,
    characters: int,
    marks: bool = False,
) -> web.StreamResponse:
    """A stream being made as events: a delta per sentence as it is ready (after its marks,
    with ``marks``), then done."""
    resp = await open_stream(request, headers, CONTENT_TYPE)
    timeout_s = request.app[keys.SETTINGS].write_timeout_s

    async def events() -> None:
        async for data in pieces(request, stream):
            found, stream.piece_marks = stream.piece_marks, []
            for chunk in deltas(data, found if marks else None):
                await write_within(request, resp, chunk, timeout_s)
        await write_within(request, resp, done(characters, stream.audio_s), timeout_s)

    # The status is sent: a failure is said in an event before the connection drops.
    return await counted(request, resp, stream.key, "event stream", events(), error_event)


async def pieces(request: web.Request, stream: SpeechStream) -> AsyncIterator[bytes]:
    """``stream.first``, then each chunk as it is ready, while the client is still there."""
    yield stream.first
    async for chunk in stream.chunks():
        if request.transport is None or request.transport.is_closing():
            raise ConnectionResetError("client went away")
        yield chunk


async def counted(
    request: web.Request,
    resp: web.StreamResponse,
    key: str,
    what: str,
    writes: Coroutine[Any, Any, None],
    error: Callable[[Exception], bytes] | None = None,
) -> web.StreamResponse:
    """``writes`` (a streamed body) to ``resp``'s end, counted by how it ended. A failure (said
    in ``error``'s bytes, when given) drops the connection: no client takes the audio as whole."""
    streams = request.app[keys.METRICS].streams
    try:
        await writes
        await resp.write_eof()
        streams.labels("complete").inc()
    except asyncio.CancelledError:
        streams.labels("disconnected").inc()
        raise
    except ConnectionResetError:
        streams.labels("disconnected").inc()
        log.info("%s ended by the client key=%s", what, key)
    except Exception as exc:
        streams.labels("failed").inc()
        log.warning("%s failed key=%s: %s", what, key, type(exc).__name__)
        try:
            if error is not None:
                await resp.write(error(exc))
        finally:
            if request.transport is not None:
                request.transport.close()
    return resp
