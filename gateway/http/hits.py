"""A memory hit's response: its header block serialized once per stored entry, then written to
the transport with the audio in one call.

Why, what each request still writes (status line, ``Date``, ``X-Request-Id``, ``Connection``)
and where hits go out as ordinary responses instead (another ``on_response_prepare`` receiver than
the request-id stamp: CORS): docs/architecture.md, "Hit path cost". :class:`PreparedHit` keeps
the serialized block per entry (with the header multidict the rest of the gateway reads) and
:class:`HitResponse` writes it as aiohttp would have: a hand-written sliver of HTTP/1.1 on
purpose, as aiohttp offers no lower-cost way to send a fixed response. Only a plain 200 goes so
(conditional and range requests take the ordinary path), and only with :data:`FAST_HITS` (set by
the app).

A request whose exact bytes were answered so before is answered again from its bytes, ahead of
aiohttp's parsing and routing (:class:`FastPath`, :class:`FastHandler`: the repeats of bots and
IVR players on their kept connections).

**Every aiohttp internal the gateway relies on is in this module**, written against aiohttp
:data:`WRITTEN_FOR` (the minor version ``pyproject.toml`` pins; a test holds the two together):
:class:`HitResponse` sets private ``StreamResponse`` fields (:data:`_RESPONSE_FIELDS`) and
waits on ``request._payload_writer``; :func:`lift_writelines_skip` clears
``aiohttp.http_writer.SKIP_WRITELINES``; :class:`FastHandler` and :class:`FastServer` subclass
``RequestHandler`` (:data:`_HANDLER_FIELDS`) and ``Server`` (``_loop``, ``_kwargs``);
:func:`wrap_requests` replaces a connection's ``_request_handler`` (the connection cap's probe
slots). :data:`FITS` says, once at import, whether the installed aiohttp is that minor version
and still has those fields. Where it is not, nothing here touches aiohttp's internals:
:func:`hit_response` answers with aiohttp's own ``web.Response`` (the same status, headers and
body, for the CPU per hit the writer saves), the skip stays as aiohttp sets it, and
:func:`answer_repeats` and :func:`wrap_requests` do nothing. The ``fast_path`` setting turns
the writer, the lift and the answerer off on any aiohttp (:data:`FAST_HITS`, gateway.cli.serve).
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, NamedTuple

import aiohttp
from aiohttp import HttpVersion11, http_writer, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.web import RequestHandler
from multidict import CIMultiDict
from prometheus_client import Counter

from gateway.http.errors import PlainRefusals
from gateway.http.requestid import REQUEST_ID, RequestIds
from gateway.memo import BytesMemo

# True with fast_path on and no response-prepare receiver but the request-id stamp (module doc).
FAST_HITS = web.AppKey("fast_hits", bool)

# The function a connection's requests are answered with (RequestHandler reads it per request).
RequestFunction = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

# The aiohttp (major, minor) the internals below were read in and tested against.
WRITTEN_FOR = (3, 14)

# The private StreamResponse fields HitResponse sets. Were one renamed, setting it would quietly
# make a new attribute (aiohttp would then send a second response after ours): checked at import.
_RESPONSE_FIELDS = (
    "_state",
    "_headers",
    "_status",
    "_reason",
    "_keep_alive",
    "_eof_sent",
    "_body_length",
)


def written_for(version: str) -> bool:
    """Whether aiohttp ``version`` (``aiohttp.__version__``) is the minor release the internals
    of this module were written against (:data:`WRITTEN_FOR`)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found[1]), int(found[2])) == WRITTEN_FOR


# The private RequestHandler members FastHandler and wrap_requests read or set (its connection
# state, the keep-alive timer moved on as aiohttp would after a response); checked at import too.
_HANDLER_FIELDS = (
    "_force_close",
    "_close",
    "_messages",
    "_handle_request",
    "_payload_parser",
    "_upgraded",
    "_request_handler",
    "_request_count",
    "_keepalive",
    "_keepalive_timeout",
    "_next_keepalive_close_time",
    "_keepalive_handle",
    "_process_keepalive",
    "_loop",
    "_manager",
)


def _fields_there() -> bool:
    probe = web.StreamResponse()
    return (
        all(hasattr(probe, name) for name in _RESPONSE_FIELDS)
        and all(hasattr(RequestHandler, name) for name in _HANDLER_FIELDS)
        and hasattr(http_writer, "SKIP_WRITELINES")
        and hasattr(web.BaseRequest, "message")
    )


# Decided once, at import (module doc): the hit writer and the writelines lift, or neither.
FITS = written_for(aiohttp.__version__) and _fields_there()

# What asyncio's own socket transport does with ``writelines`` on a Python version: "joins" the
# pieces into one bytes and writes that (WriteTransport's, before 3.12: what aiohttp's skip does
# anyway), "unsafe" (3.12.0-3.12.8, 3.13.0-3.13.1: its own writelines ignores the write
# high-water mark, CVE-2024-12254, the reason aiohttp skips it), or "sends" the pieces with one
# flow-controlled sendmsg, without a copy (later; aiohttp then calls it by itself).
AsyncioWritelines = Literal["joins", "unsafe", "sends"]


def asyncio_writelines(version: tuple[int, int, int]) -> AsyncioWritelines:
    """What asyncio's socket transport's ``writelines`` does on Python ``version``."""
    if version < (3, 12):
        return "joins"
    if version < (3, 12, 9) or (3, 13) <= version < (3, 13, 2):
        return "unsafe"
    return "sends"


ASYNCIO_WRITELINES = asyncio_writelines(
    (sys.version_info.major, sys.version_info.minor, sys.version_info.micro)
)


def _uvloop_made(kind: type[object]) -> bool:
    return kind.__module__.partition(".")[0] == "uvloop"


def lift_writelines_skip(loop: asyncio.AbstractEventLoop) -> bool:
    """Let aiohttp hand a response's headers and body to ``loop``'s transports as one
    ``writelines`` where that is safe; True when it did (call it with the loop a process serves on).

    aiohttp skips ``transport.writelines`` where asyncio's is unsafe or only joins
    (:func:`asyncio_writelines`) and joins status line, headers and body itself, a copy of every
    body; uvloop's transport has a flow-controlled ``writelines`` of its own (one ``writev``, no
    copy), which every response but a memory hit (:class:`HitResponse` asks the transport) gets
    only this way. ``SKIP_WRITELINES`` is a global read on every write of every connection, so it
    is lifted only where that is safe for any transport the process may hold (a test run, a
    library's loop in a thread): on uvloop, on a Python whose asyncio ``writelines`` joins and
    writes (before 3.12: what the skip does instead; docs/architecture.md, "Hit path cost"), on
    the aiohttp this was written for (:data:`FITS`).
    """
    if not (FITS and ASYNCIO_WRITELINES == "joins" and _uvloop_made(type(loop))):
        return False
    http_writer.SKIP_WRITELINES = False
    return True


# What aiohttp refuses in a header (http_writer._safe_header): control characters but tab.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class PreparedHit:
    """The headers of a hit on one stored entry: ``headers`` (what the gateway reads, and what
    an ordinary response is built from) and ``head``, the same headers serialized with the
    ``Content-Length`` of ``size`` bytes and aiohttp's ``Server`` line. ``digest`` names the
    bytes it was made for (the store may hold other bytes under the key later)."""

    __slots__ = ("digest", "head", "headers", "size")

    def __init__(self, digest: str, headers: Mapping[str, str], size: int) -> None:
        self.digest = digest
        self.headers: CIMultiDict[str] = CIMultiDict(headers)
        self.size = size
        lines = [*headers.items(), ("Content-Length", str(size)), ("Server", SERVER_SOFTWARE)]
        for name, value in lines:
            # (Every value is the gateway's own; a line break would split the response, so it
            # is refused as aiohttp refuses it.)
            if _CONTROL.search(name) or _CONTROL.search(value):
                raise ValueError(f"a control character in a hit's {name!r} header")
        self.head = "".join(f"{name}: {value}\r\n" for name, value in lines).encode("latin-1")


# The status line of each HTTP version and what aiohttp adds for the connection: HTTP/1.1 keeps
# the connection open unless told (``Connection: close`` when it will not), HTTP/1.0 closes it
# unless the client asked to keep it (then ``Connection: keep-alive``).
_STATUS = {True: b"HTTP/1.1 200 OK\r\n", False: b"HTTP/1.0 200 OK\r\n"}
_CONNECTION = {
    (True, True): b"",
    (True, False): b"Connection: close\r\n",
    (False, True): b"Connection: keep-alive\r\n",
    (False, False): b"",
}

# Above this size, where the transport would join them, a hit's status line and headers go out
# in their own write ahead of the body instead of being copied together with it.
SEPARATE_HEADERS_FROM = 16 * 1024

# Whether a transport type's ``writelines`` sends the pieces without joining them: uvloop's
# always, asyncio's where it "sends" (ASYNCIO_WRITELINES). Asked of the transport, not of
# aiohttp's skip, so a hit gets one writev on uvloop wherever the skip is left in place.
# (Remembered per type: HitResponse.prepare reads it with one dict lookup.)
_GATHERS: dict[type[object], bool] = {}


def _gathers(kind: type[object]) -> bool:
    found = _GATHERS[kind] = _uvloop_made(kind) or ASYNCIO_WRITELINES == "sends"
    return found


_date: tuple[int, bytes] = (0, b"")


def date_line() -> bytes:
    """``Date: <IMF-fixdate>\\r\\n`` for now, formatted once a second."""
    global _date
    now = int(time.time())
    if now != _date[0]:
        _date = (now, f"Date: {email.utils.formatdate(now, usegmt=True)}\r\n".encode("ascii"))
    return _date[1]


def _head(hit: PreparedHit, v11: bool, keep_alive: bool, rid: str | None) -> bytes:
    return b"".join(
        (
            _STATUS[v11],
            hit.head,
            date_line(),
            b"" if rid is None else b"X-Request-Id: %s\r\n" % rid.encode(),
            _CONNECTION[v11, keep_alive],
            b"\r\n",
        )
    )


def _send(transport: asyncio.Transport, head: bytes, body: bytes) -> None:
    """``head`` then ``body`` to ``transport``, in one call where it gathers without a copy."""
    gathers = _GATHERS.get(type(transport))
    if gathers is None:
        gathers = _gathers(type(transport))
    if not body:
        transport.write(head)
    elif gathers:
        transport.writelines((head, body))  # one writev, no copy
    elif len(body) < SEPARATE_HEADERS_FROM:
        transport.write(head + body)
    else:  # (asyncio's transport before 3.12: join() would copy a large body)
        transport.write(head)
        transport.write(body)


class HitResponse(web.StreamResponse):
    """A 200 with stored ``audio`` and a :class:`PreparedHit`'s headers, written by
    :meth:`prepare` in one transport call (module doc). It is a complete ``StreamResponse`` to
    aiohttp and the gateway's edge: status, headers, ``content_length``, ``keep_alive``,
    ``body_length`` once sent. Made only where :data:`FITS` (:func:`hit_response`)."""

    def __init__(self, audio: bytes, hit: PreparedHit) -> None:
        # Not StreamResponse.__init__: it copies the headers into a new multidict and checks the
        # status, per request; these are fixed per entry (and never changed: module doc).
        self._state = {}
        self._headers = hit.headers
        self._status = 200
        self._reason = "OK"
        self._audio = audio
        self._hit = hit

    @property
    def content_length(self) -> int | None:
        return self._hit.size

    @content_length.setter
    def content_length(self, value: int | None) -> None:
        raise RuntimeError("a hit's Content-Length is its audio's")

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._eof_sent:
            return None
        writer = request._payload_writer
        keep_alive = request.keep_alive
        self._keep_alive = keep_alive
        v11 = request.version == HttpVersion11
        # (The id is safe ASCII: gateway.http.requestid checked or made it.)
        head = _head(self._hit, v11, keep_alive, request.get(REQUEST_ID))
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        body = b"" if request.method == "HEAD" else self._audio
        _send(transport, head, body)
        self._eof_sent = True
        self._body_length = len(head) + len(body)
        await writer.drain()  # (waits only while the transport is over its high-water mark)
        return writer


def hit_response(request: web.Request, audio: bytes, hit: PreparedHit) -> web.StreamResponse:
    """A memory hit's response: a :class:`HitResponse` where :data:`FITS` and the app allows it
    (:data:`FAST_HITS`), else aiohttp's own ``web.Response`` with the same headers and body.
    (aiohttp's parser takes HTTP/1.0 and 1.1 only, the versions :class:`HitResponse` knows.)"""
    if FITS and request.app.get(FAST_HITS, False):
        return HitResponse(audio, hit)
    return web.Response(body=audio, headers=hit.headers)


# Request headers after which the answer is not the plain 200 of the stored bytes (conditional and
# range requests, an expectation, a protocol switch, a chunked body) or would echo the client's
# own value (its request id): a request with one is never answered from its bytes.
_NOT_REPLAYED = (
    "If-None-Match",
    "If-Modified-Since",
    "If-Range",
    "Range",
    "Expect",
    "Upgrade",
    "Transfer-Encoding",
    "X-Request-Id",
)

# How a repeat is answered again, now: ``(rendition key, prepared headers, audio)`` while its
# audio is in the memory tier (counted as a speech hit), else None (the ordinary path answers).
Again = Callable[[], "tuple[str, PreparedHit, bytes] | None"]


class Repeat(NamedTuple):
    """A request's exact bytes were answered with a memory hit: how to answer them again."""

    route: str
    method: str
    v11: bool
    again: Again


class FastPath:
    """Memory hits answered from the bytes of a request already answered once.

    Bots and IVR players send the very same bytes for the same prompt on their kept
    connections. When aiohttp has parsed such bytes as exactly one whole request and the gateway
    answered it with a plain memory hit (:class:`HitResponse`), the bytes are remembered with how
    they were answered; when a connection's next bytes are exactly those, :class:`FastHandler`
    answers them before aiohttp parses them: the entry looked up in the memory tier again
    (evicted: the ordinary path answers), counted, logged and timed as the edge does a hit, under
    a fresh request id. Skipped is what the same bytes always give (aiohttp's request object and
    routing, the gateway's parsing, validation and content addressing: the answer to given bytes
    depends only on them and on settings fixed at start, as
    :class:`gateway.api.parsing.RequestMemo` notes; docs/architecture.md, "Hit path cost").

    Bounded: at most 4,096 requests of at most 8 KiB each, 16 MiB in all.
    ``allowed`` says whether answering from bytes is allowed now (checked on every answer: API
    keys switched on by a reload need every request checked).
    """

    def __init__(
        self,
        observe: Callable[..., None],
        ids: RequestIds,
        allowed: Callable[[], bool],
        *,
        counter: Counter | None = None,
    ) -> None:
        self.memo: BytesMemo[Repeat] = BytesMemo(4096, 8192, 16 * 1024 * 1024)
        self.observe = observe
        self.ids = ids
        self.allowed = allowed
        self.counter = counter
        # Requests answered here, and how many of them ``counter`` holds.
        self.answered = 0
        self._counted = 0

    def wants(self, request: web.Request, response: web.StreamResponse) -> bool:
        """Whether ``request``, answered with ``response``, may be remembered (cheap: asked on
        every memory hit of the ordinary path)."""
        handler = request.protocol
        return (
            isinstance(response, HitResponse)
            and isinstance(handler, FastHandler)
            and handler._seen is not None
            and handler._seen[0] is request.message
        )

    def remember(self, request: web.Request, again: Again) -> None:
        """Remember the bytes of ``request`` (it :meth:`wants` it) with ``again``, when they
        were exactly this one whole request and nothing in it asks for more than the plain
        stored bytes."""
        handler = request.protocol
        assert isinstance(handler, FastHandler) and handler._seen is not None
        data = handler._seen[1]
        headers = request.headers
        if (
            not _one_request(data, request)
            or request.method not in ("GET", "POST")
            or not request.keep_alive
            or any(name in headers for name in _NOT_REPLAYED)
            or not self.allowed()
        ):
            return
        resource = request.match_info.route.resource
        if resource is None:
            return
        v11 = request.version == HttpVersion11
        self.memo.put(data, Repeat(resource.canonical, request.method, v11, again))

    def answer(self, handler: FastHandler, data: bytes) -> bool:
        """Answer ``data``, a connection's next bytes, if they are a remembered request whose
        audio is still in memory; True when answered (module doc: written as
        :class:`HitResponse` writes)."""
        # (Bytes longer than any remembered request are not hashed for the lookup: an upload.)
        repeat = self.memo.get(data) if len(data) <= self.memo.max_key else None
        if repeat is None or not self.allowed():
            return False
        transport = handler.transport
        # A response still queued on the transport: the ordinary path waits for it to drain.
        if transport is None or transport.is_closing() or transport.get_write_buffer_size():
            return False
        started = time.perf_counter()
        found = repeat.again()
        if found is None:
            return False
        key, hit, body = found
        rid = self.ids.new()
        head = _head(hit, repeat.v11, True, rid)
        _send(transport, head, body)
        elapsed = time.perf_counter() - started
        sent = len(head) + len(body)
        self.observe(
            repeat.route, repeat.method, 200, "hit", key, elapsed, sent, elapsed, None, rid
        )
        self.answered += 1
        return True

    def flush(self) -> None:
        """Add the requests answered since the last flush to ``counter`` (run before every
        collection of the metrics, as the observer's tallies are)."""
        if self.counter is not None and self.answered > self._counted:
            self.counter.inc(self.answered - self._counted)
            self._counted = self.answered


def _one_request(data: bytes, request: web.BaseRequest) -> bool:
    """Whether ``data``, from which aiohttp's parser (at a message boundary) made ``request``,
    held exactly that request: its head, then a body of its Content-Length, nothing more."""
    end = data.find(b"\r\n\r\n")
    return end >= 0 and len(data) - end - 4 == (request.content_length or 0)


class FastHandler(PlainRefusals):
    """aiohttp's connection protocol, with a connection's next bytes offered to the server's
    :class:`FastPath` first where aiohttp would parse them as a new request and nothing is in
    progress on the connection (else aiohttp's own ``data_received``); a request the parser
    refuses gets the fixed answer of :class:`PlainRefusals`."""

    __slots__ = ("_clean", "_fast", "_finished", "_plain", "_seen")

    def __init__(self, manager: FastServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._fast = manager.fast_path
        # A connection past the connection cap gets another handler (gateway.http.connections):
        # its requests are not answered here.
        self._plain = self._request_handler
        # Whether aiohttp's parser sits at a message boundary (known at the start, and once the
        # request made of the last bytes is answered, if they were exactly that request), so
        # that the next bytes start a request.
        self._clean = True
        # The last bytes handed to aiohttp while clean, with the message they made.
        self._seen: tuple[object, bytes] | None = None
        # Requests aiohttp has answered (or given up on), of the ``_request_count`` it parsed:
        # while one is outstanding, an answer written here would overtake its response.
        self._finished = 0

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return
        if not data:  # (aiohttp's own call, to parse what its parser held back while paused)
            count = self._request_count
            super().data_received(data)
            if self._request_count != count:
                self._clean, self._seen = False, None
            return
        if not self._clean:
            self._seen = None
            super().data_received(data)
            return
        if (
            self._finished == self._request_count
            and not self._messages
            and self._payload_parser is None
            and not self._upgraded
            and self._request_handler is self._plain
            and self._fast.answer(self, data)
        ):
            self._answered()
            return
        count = self._request_count
        super().data_received(data)
        self._clean = False
        messages = self._messages
        one = self._request_count == count + 1 and messages
        self._seen = (messages[-1][0], data) if one else None

    async def _handle_request(
        self,
        request: web.BaseRequest,
        start_time: float | None,
        request_handler: RequestFunction,
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._finished += 1
            seen = self._seen
            if seen is not None and seen[0] is request.message:
                # Bytes that were exactly this request leave the parser at a message boundary:
                # the connection's next bytes start a request, and may be looked up whole.
                self._seen = None
                self._clean = _one_request(seen[1], request)

    def _answered(self) -> None:
        # What aiohttp's RequestHandler.start does after a response on a kept connection: the
        # idle timer starts again.
        if self._keepalive:
            close_time = self._loop.time() + self._keepalive_timeout
            self._next_keepalive_close_time = close_time
            if self._keepalive_handle is None:
                self._keepalive_handle = self._loop.call_at(close_time, self._process_keepalive)


class FastServer(web.Server):
    """aiohttp's ``Server`` making :class:`FastHandler` connections for ``fast_path``."""

    fast_path: FastPath

    def __call__(self) -> RequestHandler:
        return FastHandler(self, loop=self._loop, **self._kwargs)


def answer_repeats(server: web.Server, fast: FastPath) -> bool:
    """Make ``server`` (an ``AppRunner``'s, set up, not yet serving) answer repeated requests
    from their bytes (:class:`FastPath`); True when it does, False (aiohttp's own protocol
    serves every request) on another aiohttp (:data:`FITS`)."""
    if not FITS or type(server) is not web.Server or not hasattr(server, "_kwargs"):
        return False
    server.__class__ = FastServer
    assert isinstance(server, FastServer)
    server.fast_path = fast
    return True


def wrap_requests(
    handler: RequestHandler, wrap: Callable[[RequestFunction], RequestFunction]
) -> bool:
    """Answer the requests of ``handler``'s connection with ``wrap`` of the function aiohttp
    answers them with (it reads it per request); False, nothing done, on an aiohttp other than
    the one this module was written for (:data:`FITS`)."""
    inner = handler._request_handler if FITS else None
    if inner is None:
        return False
    handler._request_handler = wrap(inner)
    return True
