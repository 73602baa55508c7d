"""Connection hygiene (issue 12, point 7): slow or idle clients are dropped and connections are
capped, so a few sockets cannot hold the gateway.

- Idle and header time: aiohttp's keep-alive timer, armed when a connection opens and after each
  response, closes a connection still waiting for a complete request when it fires; so
  ``keepalive_timeout_s`` bounds both an idle keep-alive connection and a client trickling its
  request headers (aiohttp's default is 3,630 s).
- Body time: ``body_timeout_s`` around every body read (:func:`gateway.api.parsing.read_body`).
- Write time: :func:`write_within` bounds each write of a streamed answer; a reader that does
  not take a piece within ``write_timeout_s`` is cut off (a 1 byte/s reader was kept forever).
- A cap: :func:`cap_connections` answers a connection beyond ``max_connections`` with a 503 and
  closes it, except in a few slots kept for health probes: a full gateway still answers
  ``GET /healthz`` and ``GET /readyz`` (an orchestrator whose liveness probe got 503 would restart
  a gateway that is only busy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.errors import Unavailable
from gateway.http.errors import error_body
from gateway.runtime.settings import Settings
from metrics import Metrics


def runner_options(settings: Settings) -> dict[str, Any]:
    """The AppRunner (aiohttp ``Server``) arguments for the connection settings."""
    return {"keepalive_timeout": settings.keepalive_timeout_s}


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


def _refusal() -> bytes:
    body = error_body(
        "too many connections to this gateway (max_connections); retry",
        Unavailable.type,
        code="too_many_connections",
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


REFUSAL = _refusal()
REFUSAL_BODY = REFUSAL.partition(b"\r\n\r\n")[2]
# Connections past the cap that are kept for a health probe, how long one may take to send its
# request, and what it may ask for: anything else (or nothing in time) gets the cap's 503.
PROBE_SLOTS = 8
PROBE_WAIT_S = 1.0
PROBE_PATHS = frozenset({"/healthz", "/readyz"})

_Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def cap_connections(server: web.Server, limit: int, metrics: Metrics) -> None:
    """Answer connections beyond ``limit`` open at once with a 503 and close them; the first
    :data:`PROBE_SLOTS` beyond it may still ask for a health probe.

    aiohttp has no connection cap of its own; its ``Server`` is told of each new connection
    (``connection_made``) before any byte is read, which is where the count is checked. A
    refused connection never reaches a handler; it is counted in
    ``voxgate_connections_refused_total``. A connection in a probe slot gets a request handler of
    its own (aiohttp's ``RequestHandler`` reads ``_request_handler`` for each request, so the
    connections under the cap pay nothing for this): a ``GET`` of a probe path is answered and the
    connection closed after it, anything else is refused, and so is a connection that sends no
    request within :data:`PROBE_WAIT_S`. Should aiohttp stop keeping that attribute, connections
    past the cap are refused as before.
    """
    made, lost = server.connection_made, server.connection_lost
    refused = metrics.connections_refused
    open_now = 0

    def refuse(transport: asyncio.Transport) -> None:
        if not transport.is_closing():
            refused.inc()
            transport.write(REFUSAL)
            transport.close()

    def probe_only(inner: _Handler, transport: asyncio.Transport) -> _Handler:
        asked = False

        def expire() -> None:
            if not asked:
                refuse(transport)

        timer = asyncio.get_running_loop().call_later(PROBE_WAIT_S, expire)

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            nonlocal asked
            asked = True
            timer.cancel()
            if request.method == "GET" and request.path in PROBE_PATHS:
                resp = await inner(request)
            else:
                refused.inc()
                resp = web.Response(
                    status=503,
                    body=REFUSAL_BODY,
                    content_type="application/json",
                    headers={"Retry-After": "1"},
                )
            resp.force_close()  # the slot is for the next probe
            return resp

        return handle

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        nonlocal open_now
        open_now += 1
        made(handler, transport)
        if open_now <= limit:
            return
        inner = getattr(handler, "_request_handler", None)
        if open_now > limit + PROBE_SLOTS or inner is None:
            refuse(transport)
        else:
            handler._request_handler = probe_only(inner, transport)

    def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
        nonlocal open_now
        open_now -= 1
        lost(handler, exc)

    # Instance attributes: RequestHandler calls ``self._manager.connection_made/_lost``.
    server.connection_made = connection_made  # type: ignore[method-assign]
    server.connection_lost = connection_lost  # type: ignore[method-assign]
