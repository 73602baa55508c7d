"""Delivering speech over HTTP, shared by every speech endpoint: whole responses (with ETag,
304 and Content-Length) and streamed ones (chunked, one chunk per sentence as it is ready).

A stream follows a :class:`gateway.speech.assembly.SpeechStream`; it never owns it. A client that
disconnects ends its own stream; the production goes on while anyone else waits for it (and its
rendition is stored for them), else its sentences not yet queued are dropped.
"""

from __future__ import annotations

import logging

from aiohttp import web
from multidict import CIMultiDict

from gateway.http import keys, sse
from gateway.http.conditional import audio_response
from gateway.http.connections import write_within
from gateway.http.hits import Again, PreparedHit, hit_response
from gateway.http.observe import RequestObserver
from gateway.http.presentation import Presentation, audio_headers
from gateway.speech.assembly import SpeechStream
from gateway.speech.caller import ask_as
from gateway.speech.request import SpeechRequest
from gateway.speech.service import SpeechService

log = logging.getLogger("voxgate.gateway")


def _again(
    service: SpeechService,
    observer: RequestObserver,
    req: SpeechRequest,
    present: Presentation,
) -> Again:
    """How the fast path answers ``req`` again (gateway.http.hits.FastPath): as the memory hit
    of :func:`serve_speech` does, counted the same way."""
    count = observer.count_speech
    model, fmt = req.model, req.fmt
    voice = service.vocabulary.models[model].voice_label(req.voice)

    def again() -> tuple[str, PreparedHit, bytes] | None:
        hit = service.memory_hit(req)
        if hit is None:
            return None
        key, entry = hit
        count(model, voice, fmt.name, "hit")
        return key, present.hit_headers(key, fmt, entry), entry.audio

    return again


def client_of(request: web.Request) -> str:
    """Who is asking: the API key's name when keys are on (``keys.CLIENT_NAME``, set by the
    authentication step), else the peer's address."""
    name = request.get(keys.CLIENT_NAME)
    if name:
        return f"key:{name}"
    return f"addr:{request.remote or 'unknown'}"


def _record(
    request: web.Request, req: SpeechRequest, key: str, cache: str, app: web.Application
) -> None:
    request[keys.CACHE_RESULT] = cache
    request[keys.AUDIO_KEY] = key
    voice = app[keys.SPEECH].vocabulary.models[req.model].voice_label(req.voice)
    app[keys.OBSERVER].count_speech(req.model, voice, req.fmt.name, cache)


# Names the request fields that were accepted but changed nothing (OpenAI's `instructions` on a
# model that cannot follow them, fields of later API versions): gateway.api.parsing.SpeechCall.
IGNORED_FIELDS = "X-Ignored-Fields"


async def serve_speech(
    request: web.Request,
    req: SpeechRequest,
    *,
    stream: bool | None = False,
    sse: bool = False,
    ignored: tuple[str, ...] = (),
    present: Presentation | None = None,
    marks: bool = False,
) -> web.StreamResponse:
    """Answer ``req``: 304 when the client holds it, else the audio, streamed when asked (and not
    already stored: stored audio goes out whole, with its Content-Length), or as server-sent
    events with ``sse`` (speech marks events too with ``marks``). ``stream=None`` is the default
    of OpenAI's endpoint: a miss streams where its format streams and it has more than one
    sentence (one sentence gains nothing: its first chunk would be all of it, without a
    Content-Length). ``ignored`` names fields that had no effect (a response header). A GET route
    passes its ``present``: Cache-Control, Last-Modified (and If-Modified-Since), its
    Content-Type."""
    app = request.app
    service = app[keys.SPEECH]
    if present is None:
        present = app[keys.PRESENTATIONS].api
    asked = request.headers
    if (
        "If-None-Match" not in asked
        and not sse
        and (not present.dated or "If-Modified-Since" not in asked)
    ):
        # The hot path, a memory hit: no awaits, no intermediate objects. (Stored audio goes out
        # whole, streaming asked or not.)
        hit = service.memory_hit(req)
        if hit is not None:
            key, entry = hit
            _record(request, req, key, "hit", app)
            prepared = present.hit_headers(key, req.fmt, entry)
            if ignored:
                headers = CIMultiDict(prepared.headers)
                headers[IGNORED_FIELDS] = ", ".join(ignored)
                return web.Response(body=entry.audio, headers=headers)
            response = hit_response(request, entry.audio, prepared)
            fast = app[keys.FAST_PATH]
            if fast.wants(request, response):
                fast.remember(request, _again(service, app[keys.OBSERVER], req, present))
            return response
    extra = {IGNORED_FIELDS: ", ".join(ignored)} if ignored else {}
    # The synthesis queue's share is per client; this handler's tasks inherit the name (events
    # too: without it, their misses took no share at all).
    ask_as(client_of(request))
    if sse:
        return await _events(request, req, extra, marks)
    # If-None-Match is answered against the entry held now (audio_response below): the key alone
    # does not say which bytes a client holds (other replicas, a synthesis after an eviction).
    if stream is None and not (
        req.fmt.streamable and (service.several_sentences(req) or service.passes_through(req))
    ):
        stream = False  # one sentence on its face: whole, with no trip through the assembler
    answer = await service.answer(req, stream=stream)
    if isinstance(answer, SpeechStream):
        return await _stream(request, req, answer, extra)
    _record(request, req, answer.key, answer.cache, app)
    meta = answer.entry.meta
    made = present.headers(
        answer.key, req.fmt, meta.sample_rate, answer.cache, meta.created, answer.entry.etag
    )
    created = meta.created if present.dated else None
    return audio_response(request, answer.entry.audio, {**made, **extra}, created=created)


async def _events(
    request: web.Request, req: SpeechRequest, extra: dict[str, str], marks: bool
) -> web.StreamResponse:
    """OpenAI's ``stream_format: "sse"``: the audio as ``speech.audio.delta`` events, sentence by
    sentence as it is made (stored audio at once), then ``speech.audio.done``."""
    answer = await request.app[keys.SPEECH].answer(req, stream=True)
    _record(request, req, answer.key, answer.cache, request.app)
    rate = answer.rate if isinstance(answer, SpeechStream) else answer.entry.meta.sample_rate
    headers = {**audio_headers(answer.key, req.fmt, rate, answer.cache, None), **extra}
    if isinstance(answer, SpeechStream):
        try:
            return await sse.send_stream(
                request, headers, answer, characters=len(req.text), marks=marks
            )
        finally:
            answer.close()  # this reader no longer waits for the production
    return await sse.send_whole(
        request, headers, answer.entry, characters=len(req.text), marks=marks
    )


async def _stream(
    request: web.Request, req: SpeechRequest, stream: SpeechStream, extra: dict[str, str]
) -> web.StreamResponse:
    try:
        _record(request, req, stream.key, stream.cache, request.app)
        # The streamed bytes are not the stored rendition's bytes (a WAV header of unknown
        # length, MP3/AAC frames per sentence): sse.open_stream sends no ETag.
        headers = {**audio_headers(stream.key, req.fmt, stream.rate, stream.cache, None), **extra}
        resp = await sse.open_stream(request, headers)
        timeout_s = request.app[keys.SETTINGS].write_timeout_s

        async def chunks() -> None:
            async for chunk in sse.pieces(request, stream):
                await write_within(request, resp, chunk, timeout_s)

        # The status line is gone: the only way left to say "incomplete" is to drop the
        # connection before the terminating chunk.
        return await sse.counted(request, resp, stream.key, "stream", chunks())
    finally:
        stream.close()  # this reader no longer waits for the production
