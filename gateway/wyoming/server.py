"""A Wyoming TTS server (Home Assistant) over the speech service every HTTP endpoint uses.

Built on the ``wyoming`` package (OHF-Voice/wyoming): its server and handler classes, its event
types (``describe``/``info``, ``synthesize``, ``synthesize-start/-chunk/-stop/-stopped``,
``audio-start/-chunk/-stop``, ``select-program``, ``error``, ``ping``/``pong``) and its event
writer. What happens on
each event follows wyoming-piper (OHF-Voice/wyoming-piper, wyoming_piper/handler.py), the server
Home Assistant's Piper add-on runs:

- ``describe`` answers ``info``: one TTS program per served model, each voice with its language
  (the served voices have one speaker each, so no speaker list), and
  ``supports_synthesize_streaming``;
- ``select-program`` picks the program (a served model) the connection's next ``synthesize`` and
  text streams use, as the package defines it: their voice is looked up in that model only, so
  models that share a voice name can each be chosen; without it, a voice is looked up in the
  default model first, then in the others;
- ``synthesize`` answers ``audio-start``, ``audio-chunk``s (16-bit mono PCM at the voice's rate,
  sent sentence by sentence as the speech service makes them; stored audio at once) and
  ``audio-stop``; a stored text costs no synthesis;
- ``synthesize-start`` opens a text stream; each ``synthesize-chunk`` adds text, and every
  sentence it completes is spoken at once as its own ``audio-start`` ... ``audio-stop``;
  ``synthesize-stop`` speaks what is left and answers ``synthesize-stopped``. The plain
  ``synthesize`` Home Assistant also sends inside a stream (for older servers) is ignored;
- an event of a type this server does not answer (``transcribe``, ``audio-chunk``, a type of a
  later protocol version) is dropped, as the package says servers do;
- a bad event (unparseable, bad fields, an unknown program or voice, a failed synthesis) is
  answered with an ``error`` event, and the connection goes on serving.

Reading is the one part not left to the package: its ``async_read_event`` trusts the
``data_length`` and ``payload_length`` a client declares and reads that much into memory. Here
each event's header line, data and payload are bounded (an oversized payload is read in pieces and
dropped), so a hostile client costs bounded memory; events themselves are still the package's
:class:`~wyoming.event.Event`. Connections are bounded in number and in time as
docs/assistants.md, "Home Assistant (Wyoming)", says.

The listening socket is asyncio's ``start_server`` (with ``reuse_port`` under ``serve --workers
N``): on uvloop it is uvloop's own server class, so nothing here may assume ``asyncio.Server``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from functools import partial
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, SelectProgram, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler, AsyncTcpServer, HandlerFactory
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from cache.keys import normalize_text
from gateway.api.compat import check_language, default_voice, find_voice
from gateway.api.parsing import (
    ExpansionMemo,
    build_request,
    resolve_voice,
    speech_text,
    validate_off_loop,
)
from gateway.errors import BadRequest, VoxgateError
from gateway.runtime.buildinfo import version
from gateway.runtime.settings import Settings
from gateway.speech.assembly import SpeechStream
from gateway.speech.caller import ask_as
from gateway.speech.request import SpeechRequest
from gateway.speech.service import SpeechService
from metrics import Metrics
from synth import audio
from synth.cancellation import cancel_and_wait
from synth.errors import ClientQueueFull, SynthesisError
from synth.sentences import SentenceSplitter

log = logging.getLogger("voxgate.wyoming")

ATTRIBUTION = Attribution(name="voxgate", url="https://github.com/voxgate/voxgate")
# Bounds on what one event may carry. A header line is a small JSON object; the data holds the
# text (at most max_input_chars characters, 4 bytes each in UTF-8) and a voice; a TTS server
# takes no payload, so any is read in pieces and dropped.
MAX_LINE = 64 * 1024
MAX_PAYLOAD_PIECE = 64 * 1024
SAMPLE_WIDTH = 2  # 16-bit PCM
KNOWN_EVENTS = (
    "describe",
    "synthesize",
    "synthesize-start",
    "synthesize-chunk",
    "synthesize-stop",
    "select-program",
    "ping",
)


class BadEvent(Exception):
    """An event that cannot be read or used; ``fatal`` when the framing is lost with it."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


class Dropped(Exception):
    """The connection is given up on: the client was idle, or stopped reading (``reason``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def read_event(reader: asyncio.StreamReader, max_data: int, idle_s: float) -> Event | None:
    """The next event, or None at the end of the stream; :class:`BadEvent` for one that breaks
    the rules (the bytes it declared are consumed, so the next event can still be read);
    :class:`Dropped` when no header line comes within ``idle_s``, or the rest of the event
    does not come within ``idle_s`` of its header."""
    try:
        async with asyncio.timeout(idle_s):
            line = await reader.readline()
    except ValueError as exc:  # longer than the reader's limit: the framing is lost
        raise BadEvent(f"event header longer than {MAX_LINE} bytes", fatal=True) from exc
    except TimeoutError:
        raise Dropped("idle", f"no event for {idle_s:g} s (wyoming_idle_timeout_s)") from None
    if not line:
        return None
    try:
        async with asyncio.timeout(idle_s):
            return await _read_rest(reader, line, max_data)
    except TimeoutError:
        raise Dropped(
            "idle", f"an event's data took over {idle_s:g} s (wyoming_idle_timeout_s)"
        ) from None


async def _read_rest(reader: asyncio.StreamReader, line: bytes, max_data: int) -> Event:
    """The event whose header is ``line``: its data read and checked, its payload dropped."""
    try:
        header = json.loads(line)
    except (ValueError, RecursionError) as exc:
        # (not UTF-8 or not JSON, a number past int()'s 4,300 digits, nesting past the stack)
        raise BadEvent("event header is not a JSON object") from exc
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise BadEvent("event header must be a JSON object with a string 'type'")
    data_length = header.get("data_length") or 0
    payload_length = header.get("payload_length") or 0
    if not isinstance(data_length, int) or not isinstance(payload_length, int):
        raise BadEvent("data_length and payload_length must be integers", fatal=True)
    if data_length < 0 or payload_length < 0:
        raise BadEvent("data_length and payload_length must not be negative", fatal=True)
    # Everything the event declared is consumed before it is judged. A TTS server reads no
    # payload: it is consumed without being kept, and so is data over the limit.
    raw = await reader.readexactly(data_length) if data_length <= max_data else b""
    await _discard(reader, payload_length + (data_length if data_length > max_data else 0))
    if data_length > max_data:
        raise BadEvent(f"event data is {data_length} bytes; the limit is {max_data}")
    data = header.get("data") or {}
    extra: Any = {}
    if raw:
        try:
            extra = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise BadEvent("event data is not a JSON object") from exc
    if not isinstance(extra, dict) or not isinstance(data, dict):
        raise BadEvent("event data must be a JSON object")
    return Event(type=header["type"], data={**data, **extra})


async def _discard(reader: asyncio.StreamReader, length: int) -> None:
    while length > 0:
        piece = await reader.read(min(length, MAX_PAYLOAD_PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)
        length -= len(piece)


def client_name(writer: asyncio.StreamWriter) -> str:
    """Who a Wyoming connection is for the per-client shares: the connection itself (its peer's
    address and port; the process id, since the host's gateway processes share the counts)."""
    peer = writer.get_extra_info("peername")
    where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"
    return f"wyoming:{os.getpid()}:{where}"


class SpeechEventHandler(AsyncEventHandler):
    """One Wyoming connection: TTS events answered from the speech service."""

    def __init__(
        self,
        server: WyomingServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(reader, writer)
        self.server = server
        self.words = server.words
        self.settings = server.settings
        self.metrics = server.metrics
        # A text stream (synthesize-start ... synthesize-stop): its voice and unspoken text.
        self._stream_voice: dict[str, Any] | None = None
        self._pending = ""
        # The model select-program chose for this connection ("": none chosen).
        self._program = ""

    async def write_event(self, event: Event) -> None:
        """Send ``event``, or drop the connection (:class:`Dropped`) when the client has not
        taken it within ``write_timeout_s`` (it stopped reading: audio would pile up)."""
        timeout_s = self.settings.write_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await async_write_event(event, self.writer)
        except TimeoutError:
            # abort(), not close(): close() would wait to flush to the very reader that stalls.
            self.writer.transport.abort()
            raise Dropped(
                "write_timeout", f"client did not read for {timeout_s:g} s (write_timeout_s)"
            ) from None

    async def run(self) -> None:
        """Read events until the client leaves; answer each (a bad one with an error event)."""
        max_data = max(MAX_LINE, 4 * self.settings.max_input_chars + 4096)
        idle_s = self.settings.wyoming_idle_timeout_s
        task = asyncio.current_task()
        assert task is not None
        self.server.tasks.add(task)
        # The protocol carries no key: each connection is a client with its own share of the
        # synthesis queue (queue_per_client) and of the renditions being made.
        ask_as(client_name(self.writer))
        try:
            while True:
                try:
                    event = await read_event(self.reader, max_data, idle_s)
                except BadEvent as exc:
                    self.metrics.wyoming_events.labels("other", "error").inc()
                    await self.write_event(Error(text=str(exc), code="bad_event").event())
                    if exc.fatal:
                        break
                    continue
                if event is None:
                    break
                await self.handle_event(event)
        except (ConnectionError, asyncio.IncompleteReadError):
            log.debug("wyoming client went away")
        except Dropped as exc:
            self.metrics.wyoming_dropped.labels(exc.reason).inc()
            log.info("wyoming client dropped: %s", exc)
        finally:
            self.writer.close()
            self.server.tasks.discard(task)
            self.server.closed_one()

    async def handle_event(self, event: Event) -> bool:
        """Answer ``event``; a failure is answered with an ``error`` event. Always True: the
        connection stays open."""
        if event.type not in KNOWN_EVENTS:
            # The protocol's rule for a type a server does not know: drop it, answer nothing.
            self.metrics.wyoming_events.labels("other", "dropped").inc()
            log.debug("wyoming event dropped: %.40r", event.type)
            return True
        kind = event.type
        try:
            await self._dispatch(event)
            self.metrics.wyoming_events.labels(kind, "ok").inc()
        except VoxgateError as exc:
            self.metrics.wyoming_events.labels(kind, "error").inc()
            await self.write_event(Error(text=exc.message, code=exc.code or "bad_request").event())
        except SynthesisError as exc:
            self.metrics.wyoming_events.labels(kind, "error").inc()
            log.warning("wyoming synthesis failed: %s", type(exc).__name__)
            code = "client_queue_full" if isinstance(exc, ClientQueueFull) else "synthesis_failed"
            await self.write_event(Error(text=str(exc), code=code).event())
        return True

    async def _dispatch(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self.write_event(self.server.info().event())
        elif SelectProgram.is_type(event.type):
            self._program = self._select(event.data.get("name"))
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif Synthesize.is_type(event.type):
            if self._stream_voice is not None:
                return  # sent inside a stream for servers without streaming: the stream speaks
            await self._speak(_text(event.data), _voice(event.data))
        elif SynthesizeStart.is_type(event.type):
            self._stream_voice = _voice(event.data)
            self._pending = ""
        elif SynthesizeChunk.is_type(event.type):
            if self._stream_voice is None:
                raise BadRequest("synthesize-chunk outside a stream: send synthesize-start first")
            await self._add_text(_text(event.data, allow_empty=True))
        elif SynthesizeStop.is_type(event.type):
            if self._stream_voice is None:
                raise BadRequest("synthesize-stop outside a stream: send synthesize-start first")
            voice, rest = self._stream_voice, self._pending
            self._stream_voice, self._pending = None, ""
            if rest.strip():
                await self._speak(rest, voice)
            await self.write_event(SynthesizeStopped().event())

    def _select(self, name: Any) -> str:
        """The served model ``select-program`` names (its exact name first, then ignoring case,
        as clients match the advertised names)."""
        if not isinstance(name, str) or not name:
            raise BadRequest("select-program needs a program 'name'", param="name")
        models = self.words.models
        if name in models:
            return name
        folded = {m.lower(): m for m in models}
        if name.lower() in folded:
            return folded[name.lower()]
        raise BadRequest(
            f"unknown program {name[:64]!r}; available: {', '.join(models)}",
            param="name",
            code="program_not_found",
        )

    async def _add_text(self, text: str) -> None:
        """Add streamed text; speak every sentence it completes (all but the last one seen:
        it may still grow)."""
        assert self._stream_voice is not None
        self._pending += text
        if len(self._pending) > self.settings.max_input_chars:
            self._stream_voice, self._pending = None, ""
            raise BadRequest(
                f"streamed text holds over {self.settings.max_input_chars} characters without "
                "ending a sentence; the stream is closed",
                code="input_too_long",
            )
        pending = normalize_text(self._pending)
        if not pending:
            return
        sentences = await asyncio.to_thread(self.server.splitter.split, pending)
        if len(sentences) < 2:
            return
        # The sentences joined by single spaces are the normalized text (SentenceSplitter's
        # promise), so the last one is what follows the others; a space the client sent after
        # it still separates it from the next chunk.
        tail = " " if self._pending[-1:].isspace() else ""
        self._pending = sentences[-1] + tail
        for sentence in sentences[:-1]:
            await self._speak(sentence, self._stream_voice)

    def _request(self, text: str, voice: dict[str, Any]) -> SpeechRequest:
        for field in ("name", "language", "speaker"):
            if not isinstance(voice.get(field), str | None):
                raise BadRequest(f"voice {field} must be a string", param=f"voice.{field}")
        name, language, speaker = voice.get("name"), voice.get("language"), voice.get("speaker")
        if self._program:
            # The chosen program's voices only: another model's voice of the same name is not it.
            if name:
                model, chosen = self._program, resolve_voice(name, self._program, self.words)
            elif language:
                model, chosen = self._voice_for_language(language, [self._program])
            else:
                model, chosen = self._program, default_voice(self._program, self.words)
        else:
            model, chosen = (
                find_voice(name, self.words)
                if name or not language
                else self._voice_for_language(language)
            )
        if name and language:
            check_language(language, model, chosen, self.words)
        if speaker:  # (the served voices have one speaker each, and no speaker names)
            raise BadRequest(
                f"voice '{chosen}' has one speaker and no speaker names; omit 'speaker'",
                param="speaker",
                code="speaker_not_found",
            )
        # Home Assistant's TTS may send SSML (<speak>...) like any HTTP client.
        spoken = speech_text(
            text,
            self.settings,
            self.words,
            model,
            chosen,
            param="text",
            expansions=self.server.expansions,
        )
        return build_request(
            spoken,
            model=model,
            voice=chosen,
            fmt=audio.FORMATS["pcm"],
            sample_rate=self.words.models[model].sample_rate,
        )

    def _voice_for_language(
        self, language: str, models: list[str] | None = None
    ) -> tuple[str, str]:
        """The first voice of ``models`` (default: every served model, the default first) that
        speaks ``language``."""
        words = self.words
        if models is None:
            models = [words.default_model, *words.models]
        for model in dict.fromkeys(m for m in models if m in words.models):
            for voice in words.models[model].voices():
                try:
                    check_language(language, model, voice.name, words)
                except BadRequest:
                    continue
                return model, voice.name
        raise BadRequest(
            f"no voice speaks language {language[:20]!r}",
            param="voice.language",
            code="unsupported_language",
        )

    async def _speak(self, text: str, voice: dict[str, Any]) -> None:
        """``audio-start``, the audio of ``text`` as ``audio-chunk``s as it is made,
        ``audio-stop``. The request is made in a thread when a text front end may run (tens of
        milliseconds for a long Markdown text: not on the event loop)."""
        raw = text.encode("utf-8", "replace")
        req = await validate_off_loop(self.settings, raw, self._request, text, voice)
        answer = await self.server.service.answer(req, stream=True)
        if isinstance(answer, SpeechStream):
            try:
                await self.write_event(
                    AudioStart(rate=answer.rate, width=SAMPLE_WIDTH, channels=1).event()
                )
                await self._send(answer.first, answer.rate)
                async for chunk in answer.chunks():
                    await self._send(chunk, answer.rate)
            finally:
                answer.close()  # no longer waiting: a production nobody waits for stops
        else:
            rate = answer.entry.meta.sample_rate
            await self.write_event(AudioStart(rate=rate, width=SAMPLE_WIDTH, channels=1).event())
            await self._send(answer.entry.audio, rate)
        await self.write_event(AudioStop().event())

    async def _send(self, pcm: bytes, rate: int) -> None:
        step = self.settings.wyoming_samples_per_chunk * SAMPLE_WIDTH
        for start in range(0, len(pcm), step):
            chunk = AudioChunk(
                rate=rate, width=SAMPLE_WIDTH, channels=1, audio=pcm[start : start + step]
            )
            await self.write_event(chunk.event())


class RefusingHandler(AsyncEventHandler):
    """A connection over the bound: told so in an error event, then closed."""

    async def handle_event(self, event: Event) -> bool:
        return False

    async def run(self) -> None:
        try:
            await self.write_event(
                Error(
                    text="too many Wyoming connections; try again later",
                    code="too_many_connections",
                ).event()
            )
        except ConnectionError:
            log.debug("refused wyoming client went away")
        finally:
            self.writer.close()


def _text(data: dict[str, Any], *, allow_empty: bool = False) -> str:
    text = data.get("text")
    if not isinstance(text, str):
        raise BadRequest("'text' must be a string", param="text")
    if not allow_empty and not text.strip():
        raise BadRequest("'text' is empty or whitespace only", param="text")
    return text


def _voice(data: dict[str, Any]) -> dict[str, Any]:
    voice = data.get("voice") or {}
    if not isinstance(voice, dict):
        raise BadRequest("'voice' must be an object", param="voice")
    return voice


class _TcpServer(AsyncTcpServer):
    """The package's TCP server, started with a bounded line length and, for
    ``serve --workers N``, SO_REUSEPORT (every worker listens on the one port, as for HTTP)."""

    def __init__(self, host: str, port: int, *, reuse_port: bool) -> None:
        super().__init__(host, port)
        self.reuse_port = reuse_port
        # The port listened on (the asked one, or the one the OS chose for 0), once started.
        self.port_bound = 0

    async def start(self, handler_factory: HandlerFactory) -> None:
        callback = partial(self._handler_callback, handler_factory)
        server = await asyncio.start_server(
            callback, host=self.host, port=self.port, limit=MAX_LINE, reuse_port=self.reuse_port
        )
        self._server = server
        # Its port, read now: on uvloop the server is uvloop's class, not asyncio.Server (only
        # what both have is used: ``sockets`` and the AbstractServer methods).
        self.port_bound = int(server.sockets[0].getsockname()[1])
        await server.start_serving()


class WyomingServer:
    """The Wyoming server: started and closed by the app as a cleanup context."""

    def __init__(
        self,
        service: SpeechService,
        settings: Settings,
        metrics: Metrics,
        *,
        reuse_port: bool = False,
    ) -> None:
        self.service = service
        self.words = service.vocabulary
        self.expansions = ExpansionMemo()
        self.splitter = SentenceSplitter()
        self.settings = settings
        self.metrics = metrics
        self._tcp = _TcpServer(
            settings.wyoming_host or settings.host, settings.wyoming_port, reuse_port=reuse_port
        )
        # The connections' tasks (created by the package's server), ended on close.
        self.tasks: set[asyncio.Task[Any]] = set()
        self._open = 0
        self._version = "unknown"

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return self._tcp.port_bound

    async def start(self) -> None:
        """Listen; connections are served until :meth:`close`."""
        # Package metadata is a filesystem scan: read once, off the loop.
        self._version = await asyncio.to_thread(version)
        await self._tcp.start(self._handler)
        log.info("wyoming server listening on port %d", self.port)

    def _handler(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> AsyncEventHandler:
        if self._open >= self.settings.wyoming_max_connections:
            self.metrics.wyoming_events.labels("other", "refused").inc()
            return RefusingHandler(reader, writer)
        self._open += 1
        self.metrics.wyoming_connections.inc()
        return SpeechEventHandler(self, reader, writer)

    def closed_one(self) -> None:
        """A connection ended."""
        self._open -= 1
        self.metrics.wyoming_connections.dec()

    async def close(self) -> None:
        """Stop listening and end every connection (a synthesis they started is not cancelled:
        its audio is still stored)."""
        await self._tcp.stop()
        await cancel_and_wait(*self.tasks)

    def info(self) -> Info:
        """The ``info`` answer to ``describe``: a TTS program per model, with its voices."""
        programs = []
        for name, handle in self.service.models.items():
            voices = [
                TtsVoice(
                    name=v.name,
                    attribution=ATTRIBUTION,
                    installed=True,
                    description=v.description or v.name,
                    version=None,
                    languages=[v.language] if v.language else [],
                )
                for v in handle.engine.voices()
            ]
            programs.append(
                TtsProgram(
                    name=name,
                    attribution=ATTRIBUTION,
                    installed=True,
                    description=f"voxgate model {name} ({handle.engine.name})",
                    version=self._version,
                    voices=voices,
                    supports_synthesize_streaming=True,
                )
            )
        return Info(tts=programs)
