"""A memory hit's response: its header block serialized once per stored entry, then written to
the transport with the audio in one call.

A bare aiohttp handler that returns stored bytes pays for a ``Response`` (a header multidict
copied, the body checked), then ``prepare``: content length, ``Date``, ``Server`` and
``Connection`` worked out and the headers serialized, then ``write_eof``: four more coroutine
frames before the bytes reach the transport. For a hit on stored audio every one of these is the
same for every request but ``Date`` and ``Connection``, so :class:`PreparedHit` keeps the
serialized block per entry (with the header multidict the rest of the gateway reads) and
:class:`HitResponse` writes status line + block + ``Date`` (+ ``Connection``) + body itself, as
aiohttp would have written them (same headers, same framing: ``Content-Length``, HTTP/1.0 and
keep-alive answered as aiohttp answers them, no body for ``HEAD``). That is a hand-written
sliver of HTTP/1.1 on purpose: aiohttp offers no lower-cost way to send a fixed response, and
this was most of what separated a gateway hit from bare aiohttp serving the same bytes
(docs/architecture.md, "Hit path cost").

It is used only where nothing else may change the response: no ``on_response_prepare``
receivers on the app but the request-id stamp, whose ``X-Request-Id`` line it writes itself
(:data:`FAST_HITS`, set by the app; the CORS headers of ``cors_origins`` are added by another
receiver: with CORS on, hits go out as ordinary responses), and only for a plain 200
(conditional and range requests take the ordinary path).

**Every aiohttp internal the hit path relies on is in this module**, written against aiohttp
:data:`WRITTEN_FOR` (the minor version ``pyproject.toml`` pins; a test holds the two together):
:class:`HitResponse` stands in for ``StreamResponse.__init__`` and ``prepare`` by setting seven
of its private fields (``_state``, ``_headers``, ``_status``, ``_reason``, ``_keep_alive``,
``_eof_sent``, ``_body_length``), writes to the request's transport itself and waits on
``request._payload_writer``; :func:`lift_writelines_skip` clears
``aiohttp.http_writer.SKIP_WRITELINES``. :data:`FITS` says, once at import, whether the
installed aiohttp is that minor version and still has those fields. Where it is not, nothing
here touches aiohttp's internals: :func:`hit_response` answers with aiohttp's own
``web.Response`` (the same status, headers and body, for the CPU per hit the writer saves:
docs/architecture.md, "Hit path cost"), and the skip stays as aiohttp sets it.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import sys
import time
from collections.abc import Mapping
from typing import Literal

import aiohttp
from aiohttp import HttpVersion11, http_writer, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict

from gateway.http.requestid import REQUEST_ID

# True when the app's only response-prepare receiver is the request-id stamp (module doc).
FAST_HITS = web.AppKey("fast_hits", bool)

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


def _fields_there() -> bool:
    probe = web.StreamResponse()
    return all(hasattr(probe, name) for name in _RESPONSE_FIELDS) and hasattr(
        http_writer, "SKIP_WRITELINES"
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
    ``writelines`` where that is safe; True when it did (call it in a process that serves HTTP,
    with the loop it serves on).

    Why: aiohttp never calls ``transport.writelines`` on Python before 3.12.9 (or on
    3.13.0-3.13.1), for asyncio's sake (:func:`asyncio_writelines`); it joins the status line,
    headers and body into a new bytes object instead, a copy of every response body. uvloop's
    transport is libuv's, not asyncio's: its ``writelines`` buffers the pieces, pauses the
    protocol above the high-water mark like ``write``, and sends them with one ``writev`` without
    copying. A memory hit does not need this (:class:`HitResponse` asks each transport itself);
    every other response with a body (disk and Redis hits, misses, ranges, JSON) is aiohttp's
    own and gets the ``writev`` only this way.

    Why process-wide: ``SKIP_WRITELINES`` is a global of ``aiohttp.http_writer``, read on every
    write of every connection; aiohttp has no per-loop or per-connection switch. So it is lifted
    only where lifting it is safe for *every* transport the process may hold, uvloop's or
    asyncio's (a test run, or a library with a loop of its own in a thread): on ``loop`` being
    uvloop's (elsewhere it gains nothing) and on a Python whose asyncio transport's
    ``writelines`` joins and writes (before 3.12), which is exactly what the skip does instead. On
    3.12.0-3.12.8 and 3.13.0-3.13.1 it stays (asyncio's transport is the CVE's), and from 3.12.9
    and 3.13.2 aiohttp no longer skips by itself. Never on an aiohttp that is not the one this was
    written for (:data:`FITS`).
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
        rid = request.get(REQUEST_ID)
        head = b"".join(
            (
                _STATUS[v11],
                self._hit.head,
                date_line(),
                b"" if rid is None else b"X-Request-Id: %s\r\n" % rid.encode(),
                _CONNECTION[v11, keep_alive],
                b"\r\n",
            )
        )
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        body = b"" if request.method == "HEAD" else self._audio
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
        self._eof_sent = True
        self._body_length = len(head) + len(body)
        await writer.drain()  # (waits only while the transport is over its high-water mark)
        return writer


def hit_response(request: web.Request, audio: bytes, hit: PreparedHit) -> web.StreamResponse:
    """The response to a memory hit: a :class:`HitResponse` where this aiohttp is the one it was
    written for (:data:`FITS`) and the app has no response-prepare receivers but the request-id
    stamp (they may change headers: :data:`FAST_HITS`); else aiohttp's own ``web.Response``
    with the same headers and body. (aiohttp's parser takes HTTP/1.0 and 1.1 only, the two
    versions :class:`HitResponse` knows.)"""
    if FITS and request.app.get(FAST_HITS, False):
        return HitResponse(audio, hit)
    return web.Response(body=audio, headers=hit.headers)
