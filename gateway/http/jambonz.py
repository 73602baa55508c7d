"""jambonz's custom TTS vendor endpoints: ``POST /v1/jambonz/tts`` (one prompt, answered in the
encoding ``jambonz_content_type`` names) and the streaming protocol at ``GET /v1/jambonz/stream``
(a WebSocket, sentence by sentence from the cache). Parsing: :mod:`gateway.api.jambonz`.

The streaming protocol (jambonz's custom-speech-example, ``lib/tts/streaming/elevenlabs.js``):
docs/telephony.md, "jambonz"; a failure goes back as ``{"error": message}``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
from typing import NamedTuple

from aiohttp import WSMsgType, web

from gateway.api.jambonz import parse_jambonz, parse_stream_query
from gateway.api.parsing import (
    Spoken,
    build_request,
    read_json_object,
    text_front_end,
    validate_text,
)
from gateway.errors import BadRequest, VoxgateError
from gateway.http import keys
from gateway.http.charging import admit
from gateway.http.delivery import client_of, serve_speech
from gateway.runtime.settings import Settings
from gateway.speech.caller import ask_as, caller
from gateway.speech.request import SpeechRequest, SpeechResult
from gateway.speech.vocabulary import Vocabulary
from synth import audio
from synth.cancellation import cancel_and_wait
from synth.errors import SynthesisError
from synth.sentences import SentenceSplitter

log = logging.getLogger("voxgate.gateway")

# Sentences of one stream synthesized ahead of the one being sent (bounded: a client that sends
# text faster than it can be spoken waits for the queue, not the gateway's memory).
STREAM_AHEAD = 8
# Text of one stream read but not yet queued for synthesis: messages are read while it stays
# under this, so a close frame or "stop" behind them is seen at once.
BACKLOG_CHARS = 16 * 1024


async def jambonz_tts(request: web.Request) -> web.StreamResponse:
    """``POST /v1/jambonz/tts``: jambonz's custom-vendor request, answered as the configured
    Content-Type (exactly: jambonz compares the string)."""
    app = request.app
    settings = app[keys.SETTINGS]
    body = await read_json_object(request, app[keys.MAX_BODY_BYTES], settings.body_timeout_s)
    req = parse_jambonz(body, settings, app[keys.VOCABULARY], app[keys.EXPANSIONS])
    return await serve_speech(request, req, present=app[keys.PRESENTATIONS].jambonz)


async def jambonz_stream(request: web.Request) -> web.StreamResponse:
    """``GET /v1/jambonz/stream``: jambonz's streaming TTS protocol over a WebSocket.

    On the account of the key that opened it (with keys on): every ``stream`` message is a
    request against the key's ``requests_per_minute`` (a 429 is an ``error`` message, the socket
    goes on), what it synthesizes spends the key's ``chars_per_minute`` and queue share, and the
    socket is closed (1008) when a reload of the keys file removes the key. Messages are read
    while synthesis is behind, up to :data:`BACKLOG_CHARS` of text, so a close frame or ``stop``
    is seen at once and the sentences not yet made are cancelled.
    """
    app = request.app
    settings = app[keys.SETTINGS]
    # A bad query is a 400 before the upgrade, while a status can still say so.
    model, voice, rate = parse_stream_query(dict(request.query), settings, app[keys.VOCABULARY])
    ws = web.WebSocketResponse(max_msg_size=app[keys.MAX_BODY_BYTES], heartbeat=30.0)
    await ws.prepare(request)
    request[keys.CACHE_RESULT] = "stream"
    # Whose queue share the sentences take (the key's name, else the address); tasks made
    # below inherit it, and the caller whose characters they spend (set by the route guard).
    ask_as(client_of(request))
    sockets = app[keys.KEYED_SOCKETS]
    opened_by = caller().key
    if opened_by is not None:
        sockets.add(ws, opened_by)
    await ws.send_json({"type": "connect", "data": {"sample_rate": rate, "base64_encoding": False}})
    stream = _Stream(request, ws, Voice(model, voice, rate), client_of(request))
    text = TextBuffer(SentenceSplitter(), settings.max_input_chars)
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue  # jambonz sends only JSON text messages; binary ones mean nothing here
            try:
                command = json.loads(msg.data)
                kind = command.get("type") if isinstance(command, dict) else None
                if kind == "stream":
                    chunk = command.get("text")
                    if not isinstance(chunk, str):
                        raise BadRequest("'stream' needs a string 'text'", param="text")
                    if len(chunk) > settings.max_input_chars:
                        raise BadRequest(
                            f"a 'stream' message holds at most {settings.max_input_chars} "
                            f"characters (max_input_chars); this one has {len(chunk)}",
                            param="text",
                        )
                    key = sockets.key_of(ws)
                    if key is not None:
                        await admit(request, key)
                    sentences = await text.add(chunk)
                elif kind == "flush":
                    sentences = await text.flush()
                elif kind == "stop":
                    break
                else:
                    raise BadRequest("expected a message of type stream, flush or stop")
                await stream.add(sentences)
            except (ValueError, RecursionError, VoxgateError) as exc:
                # (RecursionError: a message nested thousands deep)
                message = exc.message if isinstance(exc, VoxgateError) else "not valid JSON"
                await ws.send_json({"error": message})
    finally:
        # The loop ends on "stop" (jambonz's way to cut the prompt short) or when the socket
        # closes: nobody is left to send to. Waiters are cancelled; a synthesis others share
        # goes on (single flight), and what it makes is stored for the next time.
        sockets.discard(ws)
        await stream.close()
        await ws.close()
    return ws


class _Stream:
    """The sentences of one socket on their way out: a backlog of text not yet queued (bounded
    by :data:`BACKLOG_CHARS`), then up to :data:`STREAM_AHEAD` sentences being made, sent in
    order by one task."""

    def __init__(
        self, request: web.Request, ws: web.WebSocketResponse, voice: Voice, client: str
    ) -> None:
        app = request.app
        self.service, self.words = app[keys.SPEECH], app[keys.VOCABULARY]
        self.slots, self.client = app[keys.STREAM_SLOTS], client
        self.settings = settings = app[keys.SETTINGS]
        self.voice = voice
        self.ws = ws
        self.backlog: collections.deque[str] = collections.deque()
        self.backlog_chars = 0
        self.changed = asyncio.Event()
        self.pending: asyncio.Queue[asyncio.Task[SpeechResult]] = asyncio.Queue(STREAM_AHEAD)
        self.sender = asyncio.create_task(
            _send_in_order(request, ws, self.pending, settings.write_timeout_s)
        )
        self.feeder = asyncio.create_task(self._feed())

    async def add(self, sentences: list[str]) -> None:
        """Queue ``sentences``; waits while the backlog is over its bound."""
        for sentence in sentences:
            self.backlog.append(sentence)
            self.backlog_chars += len(sentence)
        self.changed.set()
        while self.backlog_chars > BACKLOG_CHARS:
            self.changed.clear()
            await self.changed.wait()

    async def _feed(self) -> None:
        while True:
            while not self.backlog:
                self.changed.clear()
                await self.changed.wait()
            sentence = self.backlog.popleft()
            self.backlog_chars -= len(sentence)
            self.changed.set()
            try:
                req = _sentence_request(self.words, self.voice, sentence, self.settings)
            except VoxgateError as exc:
                with contextlib.suppress(ConnectionError):
                    await self.ws.send_json({"error": exc.message})
                continue
            # Sentences past the client's share wait for a slot rather than being refused.
            task = asyncio.create_task(
                self.slots.run(self.client, functools.partial(self.service.speak, req))
            )
            task.add_done_callback(_retrieve)
            try:
                # A full queue waits here, while the socket's messages are still read.
                await self.pending.put(task)
            except asyncio.CancelledError:
                task.cancel()
                raise

    async def close(self) -> None:
        """Cancel what is not sent yet: the backlog, the sentences being made, the sender."""
        self.backlog.clear()
        # The queued sentences first: the sender may be held by the one it awaits (a shared
        # synthesis finishing), and what waits behind it must not wait with it.
        while not self.pending.empty():
            self.pending.get_nowait().cancel()
        await cancel_and_wait(self.feeder, self.sender)
        while not self.pending.empty():
            self.pending.get_nowait().cancel()


class Voice(NamedTuple):
    """What a streaming socket speaks in: its model, voice and sample rate (from its query)."""

    model: str
    voice: str
    rate: int


def _sentence_request(
    words: Vocabulary, voice: Voice, sentence: str, settings: Settings
) -> SpeechRequest:
    # Each sentence is its own request (and cache entry): a repeated sentence is a hit. It is
    # plain text (a stream carries no SSML).
    handle = words.models[voice.model]
    language = handle.voice_language(voice.voice)
    mode = text_front_end(settings, handle, voice.voice)
    text = validate_text(sentence, settings, param="text", mode=mode, language=language)
    return build_request(
        Spoken(text),
        model=voice.model,
        voice=voice.voice,
        fmt=audio.FORMATS["pcm"],
        sample_rate=voice.rate,
    )


def _retrieve(task: asyncio.Task[SpeechResult]) -> None:
    """Mark a sentence's outcome as seen: a sentence cancelled, or dropped after its socket
    broke, may have failed first, and its exception is no loop-level error."""
    if not task.cancelled():
        task.exception()


async def _send_in_order(
    request: web.Request,
    ws: web.WebSocketResponse,
    pending: asyncio.Queue[asyncio.Task[SpeechResult]],
    write_timeout_s: float,
) -> None:
    """Send each sentence's audio as it is ready, in the order the text came. Once the socket
    cannot be written (or its reader took no message for ``write_timeout_s``: then it is
    closed), the queue is still drained (its waiters cancelled), so the reader never blocks on
    a full queue nobody empties."""
    broken = False
    while True:
        task = await pending.get()
        if broken:
            task.cancel()
            continue
        try:
            result = await task
            try:
                async with asyncio.timeout(write_timeout_s):
                    await ws.send_bytes(result.entry.audio)
            except TimeoutError:
                # A reader this slow holds the production's memory: cut it off.
                # (abort: a close frame would wait behind the data this reader does not take)
                log.info("jambonz stream: client did not read for %gs; dropped", write_timeout_s)
                if request.transport is not None:
                    request.transport.abort()
                raise ConnectionResetError("client too slow") from None
        except (VoxgateError, SynthesisError) as exc:
            message = exc.message if isinstance(exc, VoxgateError) else str(exc)
            with contextlib.suppress(ConnectionError):
                await ws.send_json({"error": message})
        except ConnectionError:
            broken = True


class TextBuffer:
    """Streamed text cut into sentences: complete ones go out as soon as the next begins, the
    rest on ``flush``. Bounded: a buffer that reaches the input limit is spoken as it is."""

    def __init__(self, splitter: SentenceSplitter, max_chars: int) -> None:
        self._splitter = splitter
        self._max = max_chars
        self._text = ""

    async def add(self, chunk: str) -> list[str]:
        """Append ``chunk``; the sentences now complete."""
        self._text += chunk
        if len(self._text) >= self._max:
            return await self.flush()
        parts = await self._split()
        if len(parts) < 2:
            return []
        # The last part may still be growing; everything before it is a finished sentence.
        done, last = parts[:-1], parts[-1]
        cut = self._text.rfind(last)
        self._text = self._text[cut:] if cut >= 0 else last
        return done

    async def flush(self) -> list[str]:
        """Everything buffered, as sentences (the buffer empties)."""
        parts = await self._split()
        self._text = ""
        return parts

    async def _split(self) -> list[str]:
        if not self._text.strip():
            return []
        split = await asyncio.to_thread(self._splitter.split, self._text)
        return [p.strip() for p in split if p.strip()]
