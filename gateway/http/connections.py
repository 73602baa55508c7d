"""Connection hygiene: slow or idle clients are dropped and connections are
capped, so a few sockets cannot hold the gateway.

The settings and what each bounds: docs/security.md, "Connections and browsers". Here:
:func:`write_within` bounds each write of a streamed answer (a 1 byte/s reader was kept forever);
:func:`cap_connections` keeps the probe slots for the routes the route table marks as probes (an
orchestrator whose liveness probe got 503 would restart a gateway that is only busy); the body
read's bound is :func:`gateway.api.parsing.read_body`'s.

Requests aiohttp's parser refuses (a header with a control byte, an oversized line, a bad
request line) are logged by :class:`RefusedRequests`: a warning naming the error's kind and the
peer, at most one line per ``REFUSALS_LOGGED_EVERY_S``; never the raw line, which holds whatever
the client sent (API keys included). Nor is it answered back: :func:`plain_refusals` gives such a
request a fixed JSON body where aiohttp's echoed the offending line.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import RequestHandler

from gateway.errors import MisdirectedRequest, NotFound, Unavailable
from gateway.http.errors import PlainRefusals, error_response
from gateway.http.hits import RequestFunction, wrap_requests
from gateway.http.origins import HOST_CHECKED, host_checked, served_hosts
from gateway.runtime.settings import Settings
from metrics import Metrics

log = logging.getLogger("voxgate.gateway")

# At most one log line per this many seconds (per process) for requests the parser refuses.
REFUSALS_LOGGED_EVERY_S = 10.0


def runner_options(settings: Settings) -> dict[str, Any]:
    """The AppRunner (aiohttp ``Server``) arguments for the connection settings, and the logger
    of its request handlers (:class:`RefusedRequests`)."""
    return {"keepalive_timeout": settings.keepalive_timeout_s, "logger": RefusedRequests()}


class RefusedRequests(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger as its request handlers use it, with the requests its parser
    refuses logged safely.

    aiohttp logs each refusal at ERROR with a traceback whose message holds the raw bytes of the
    offending line, so a header with a control byte logged the API key beside it (1,000 such
    requests added 628 KiB of log). Here a refusal (any ``HttpProcessingError`` aiohttp hands its
    logger) is a WARNING on ``voxgate.gateway`` naming the error's kind and the peer, and at most
    one such line is written per ``every_s``; the refusals between two lines are counted in the
    second. aiohttp's debug line for a first request that is not HTTP at all (TLS, a scanner)
    stays a debug line, without the bytes. Everything else reaches aiohttp's logger unchanged.
    """

    def __init__(
        self,
        every_s: float = REFUSALS_LOGGED_EVERY_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.every_s = every_s
        self._clock = clock
        self._next_line_at = -math.inf
        self._unlogged = 0
        self.refused = 0

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if exc is True:
            exc = sys.exc_info()[1]
        if not isinstance(exc, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        # aiohttp passes the peer (request.remote) as the one argument of its message.
        peer = str(args[0]) if args and args[0] is not None else "unknown"
        kind = type(exc).__name__
        if level < logging.WARNING:
            super().log(level, "request refused by the HTTP parser from %s: %s", peer, kind)
            return
        self.refused += 1
        now = self._clock()
        if now < self._next_line_at:
            self._unlogged += 1
            return
        self._next_line_at = now + self.every_s
        unlogged, self._unlogged = self._unlogged, 0
        fields: Mapping[str, object] = {"peer": peer, "kind": kind, "unlogged": unlogged}
        log.warning(
            "request refused by the HTTP parser from %s: %s (logged at most once per %g s%s)",
            peer,
            kind,
            self.every_s,
            f"; {unlogged} more refused since the last such line" if unlogged else "",
            extra={"fields": fields},
        )


def plain_refusals(server: web.Server) -> None:
    """Answer every connection of ``server`` with :class:`PlainRefusals`.

    aiohttp's ``Server`` makes its handlers itself, with no way to choose their class; the
    subclass adds no state (``__slots__ = ()``), so each new handler becomes one before any byte
    is read. The fast path's handlers (:class:`gateway.http.hits.FastHandler`) are one already;
    another class (another aiohttp's) is left as it is."""
    made = server.connection_made

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        if type(handler) is RequestHandler:
            handler.__class__ = PlainRefusals
        made(handler, transport)

    server.connection_made = connection_made  # type: ignore[method-assign]


async def write_within(
    request: web.Request, resp: web.StreamResponse, data: bytes, timeout_s: float
) -> None:
    """Write one piece of a streamed answer, or drop the connection if the client does not take
    it within ``timeout_s`` (raised as ConnectionResetError: the client is as good as gone)."""
    try:
        async with asyncio.timeout(timeout_s):
            await resp.write(data)
    except TimeoutError:
        transport = request.transport
        if transport is not None:
            # abort(), not close(): close() would wait to flush to the very reader that stalls.
            transport.abort()
        raise ConnectionResetError(
            f"client did not read for {timeout_s:g} s (write_timeout_s)"
        ) from None


def _too_many() -> Unavailable:
    return Unavailable(
        "too many connections to this gateway (max_connections); retry",
        code="too_many_connections",
        retry_after_s=1.0,
    )


def _refusal() -> bytes:
    body = error_response(_too_many()).body
    assert isinstance(body, bytes)
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


REFUSAL = _refusal()
# Connections past the cap that are kept for a health probe, how long one may take to send its
# request: anything but a probe (or nothing in time) gets the cap's 503.
PROBE_SLOTS = 8
PROBE_WAIT_S = 1.0


def cap_connections(
    server: web.Server,
    limit: int,
    metrics: Metrics,
    probes: frozenset[str],
    *,
    per_source: int = 0,
) -> None:
    """Answer connections beyond ``limit`` open at once with a 503 and close them; the first
    :data:`PROBE_SLOTS` beyond it may still ask for a health probe (a ``GET`` of ``probes``:
    :attr:`gateway.http.routing.RouteTable.probe_paths`).

    aiohttp has no connection cap of its own; its ``Server`` is told of each new connection
    (``connection_made``) before any byte is read, which is where the count is checked. A
    refused connection never reaches a handler; it is counted in
    ``voxgate_connections_refused_total``. A connection in a probe slot gets a request handler of
    its own (:func:`gateway.http.hits.wrap_requests`, so the connections under the cap pay nothing
    for this): a ``GET`` of a probe path is answered and the connection closed after it, anything
    else is refused, and so is a connection that sends no request within :data:`PROBE_WAIT_S`.
    Where that cannot be done (another aiohttp), connections past the cap are all refused.

    ``per_source`` (0: none) bounds the unfinished connections of one peer address: those that
    have not yet sent a first request. One more from that address is refused as above, so a
    single client cannot hold the whole cap with idle sockets. A connection stops counting at its
    first request (the wrapper then steps aside: later requests pay nothing) or when it closes.
    """
    made, lost = server.connection_made, server.connection_lost
    refused = metrics.connections_refused
    open_now = 0

    def refuse(transport: asyncio.Transport) -> None:
        if not transport.is_closing():
            refused.inc()
            transport.write(REFUSAL)
            transport.close()

    def probe_only(inner: RequestFunction, transport: asyncio.Transport) -> RequestFunction:
        asked = False

        def expire() -> None:
            if not asked:
                refuse(transport)

        timer = asyncio.get_running_loop().call_later(PROBE_WAIT_S, expire)

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            nonlocal asked
            asked = True
            timer.cancel()
            if request.method == "GET" and request.path in probes:
                resp = await inner(request)
            else:
                refused.inc()
                resp = error_response(_too_many())
            resp.force_close()  # the slot is for the next probe
            return resp

        return handle

    # Peer address -> its connections that have not sent a request yet; and those connections.
    unfinished: dict[str, int] = {}
    pending: dict[RequestHandler, str] = {}

    def settled(handler: RequestHandler) -> None:
        peer = pending.pop(handler, None)
        if peer is not None:
            left = unfinished[peer] - 1
            if left:
                unfinished[peer] = left
            else:
                del unfinished[peer]

    def first_request(inner: RequestFunction, handler: RequestHandler) -> RequestFunction:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            settled(handler)
            wrap_requests(handler, lambda _: inner)
            return await inner(request)

        return handle

    def over_source_bound(handler: RequestHandler, transport: asyncio.Transport) -> bool:
        peername = transport.get_extra_info("peername")
        if not per_source or not peername:
            return False  # (a Unix socket: no address to count)
        peer = str(peername[0])
        if unfinished.get(peer, 0) >= per_source:
            return True
        if wrap_requests(handler, lambda inner: first_request(inner, handler)):
            unfinished[peer] = unfinished.get(peer, 0) + 1
            pending[handler] = peer
        return False

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        nonlocal open_now
        open_now += 1
        made(handler, transport)
        if open_now <= limit:
            if over_source_bound(handler, transport):
                refuse(transport)
            return
        if open_now > limit + PROBE_SLOTS or not wrap_requests(
            handler, lambda inner: probe_only(inner, transport)
        ):
            refuse(transport)

    def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
        nonlocal open_now
        open_now -= 1
        settled(handler)
        lost(handler, exc)

    # Instance attributes: RequestHandler calls ``self._manager.connection_made/_lost``.
    server.connection_made = connection_made  # type: ignore[method-assign]
    server.connection_lost = connection_lost  # type: ignore[method-assign]


OPS_PATHS = frozenset({"/metrics"})


def ops_server(
    app: web.Application,
    settings: Settings,
    probes: frozenset[str],
    metrics_response: Callable[[web.Application], Awaitable[web.Response]],
) -> web.Server:
    """The ops listener's server (``ops_port``): ``GET`` of the probes and ``/metrics``, answered
    by ``app`` exactly as on the serving port (the same middlewares: Host check, keys), anything
    else 404. It has a listening socket, a backlog and a loop callback of its own, outside the
    serving port's connection cap, so no flood of the serving port reaches the kubelet's probes
    or Prometheus. As :meth:`web.Application._make_handler` builds the app's own server.
    ``metrics_response`` is the handlers' (passed in: their modules import this one)."""
    paths = probes | OPS_PATHS
    # The serving port's /metrics needs a key when keys are on (gateway.http.routes); here it
    # is open unless metrics_auth says otherwise.
    open_metrics = not settings.metrics_auth

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and open_metrics and request.path in OPS_PATHS:
            return await metrics_response(app)
        if request.method == "GET" and request.path in paths:
            request[HOST_CHECKED] = True  # (for this listener's bind, here)
            return await app._handle(request)
        listed = ", ".join(sorted(paths))
        return error_response(NotFound(f"the ops port answers only GET of {listed}"))

    # The Host names its own bind answers, as the serving port's (a loopback ops_host: loopback
    # names only, so a DNS-rebinding page cannot read /metrics through it; an ops_host beyond
    # loopback answers the kubelet's probes by the pod's address whatever host is).
    allowed = served_hosts(settings.allowed_hosts, settings.ops_host or settings.host)
    checked = host_checked(allowed, answer) if allowed else answer

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await checked(request)  # type: ignore[arg-type]
        except MisdirectedRequest as exc:
            return error_response(exc)

    return web.Server(
        handle,
        request_factory=app._make_request,
        access_log=None,
        handler_cancellation=True,
        **runner_options(settings),
    )
