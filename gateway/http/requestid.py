"""``X-Request-Id`` on every response and in every access-log line.

A client that sends an ``X-Request-Id`` gets it back (what proxies and agent frameworks use to tie
their logs to ours; LiveKit's OpenAI plugin warns on every utterance whose answer lacks one). One
that is empty, longer than :data:`MAX_LENGTH` or holds anything but ``[A-Za-z0-9._:+/=-]`` is
replaced, not refused: an id is a courtesy, and it must never carry a line break or a quote into a
header or a log line. A request without one is given one made here: a random per-process prefix
and a counter (unique across processes and restarts with 48 random bits, and much cheaper than a
``uuid4`` per cache hit).

How the header gets onto each response: the edge (:mod:`gateway.http.edge`) picks the id before
the handler runs; a response-prepare receiver (:func:`add_request_ids`) adds it to every response
aiohttp prepares for a routed request: JSON errors, fallbacks, 304s, streamed and server-sent
answers, WebSocket upgrades; the memory hit's writer (:mod:`gateway.http.hits`), which prepares
nothing, writes it itself. Not covered: a connection refused by ``max_connections`` and a request
aiohttp could not parse, which are answered before there is a request.
"""

from __future__ import annotations

import itertools
import re
import secrets

from aiohttp import web
from multidict import istr

HEADER = istr("X-Request-Id")
# The request's id, picked by the edge before its handler runs (re-exported by gateway.http.keys;
# defined here so that gateway.http.hits, which keys imports, can read it).
REQUEST_ID = web.RequestKey("request_id", str)
# The response the stamp saw prepared (its headers gone out): what the edge logs when the
# handler is cancelled after that (a WebSocket its client closed, a stream cut short).
PREPARED = web.RequestKey("prepared", web.StreamResponse)
MAX_LENGTH = 128
# (Explicit ASCII ranges: nothing a header, a JSON string or a text log line must escape.)
REQUEST_ID_PATTERN = rf"^[A-Za-z0-9._:+/=\-]{{1,{MAX_LENGTH}}}$"
_SAFE = re.compile(REQUEST_ID_PATTERN[1:-1])


class RequestIds:
    """Request ids: the client's when it is safe to echo, else one made here."""

    __slots__ = ("_next", "prefix")

    def __init__(self) -> None:
        self.prefix = secrets.token_hex(6) + "-"
        self._next = itertools.count(1).__next__

    def new(self) -> str:
        """A fresh id: this process's prefix and the next number."""
        return self.prefix + str(self._next())

    def of(self, request: web.BaseRequest) -> str:
        """The id of ``request``: its own ``X-Request-Id`` when safe (module doc), else new."""
        sent = request.headers.get(HEADER)
        if sent is not None and _SAFE.fullmatch(sent) is not None:
            return sent
        return self.new()


def add_request_ids(app: web.Application, ids: RequestIds) -> None:
    """Put the request's id (:data:`REQUEST_ID`, set by the edge; else picked now) on every
    response the app prepares, and leave the response as :data:`PREPARED`."""

    async def stamp(request: web.Request, response: web.StreamResponse) -> None:
        rid = request.get(REQUEST_ID)
        if rid is None:  # (answered before the edge ran: an Expect: 100-continue refusal)
            rid = request[REQUEST_ID] = ids.of(request)
        response.headers[HEADER] = rid
        request[PREPARED] = response

    app.on_response_prepare.append(stamp)
