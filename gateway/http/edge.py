"""The edge every route passes: errors answered as JSON, every request counted, timed and logged,
and the 404/405 fallbacks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from aiohttp import HttpVersion11, hdrs, web

from gateway.errors import BadRequest, MethodNotAllowed, NotFound, PayloadTooLarge, clip
from gateway.http import keys
from gateway.http.auth import guarded
from gateway.http.errors import Handler, error_response, error_response_for, rejection_reason
from gateway.http.observe import RequestObserver
from gateway.http.origins import host_checked, preflight
from gateway.http.requestid import PREPARED, REQUEST_ID, RequestIds
from gateway.http.routing import Route, cors_request_headers


def edge(route: str, handler: Handler, observer: RequestObserver, ids: RequestIds) -> Handler:
    """Wrap ``handler`` (registered under the template ``route``): every failure becomes a JSON
    error (the server keeps serving), and every request is counted, timed and logged by the
    app's ``observer`` (one JSON access-log line, never the text), under its request id
    (``ids``: the client's ``X-Request-Id``, or one made here; gateway.http.requestid puts it on
    the response). Why each route is wrapped, not a middleware: docs/architecture.md, "Hit path
    cost"; unknown paths and methods reach wrapped fallbacks (:func:`add_routes`).
    """
    observe = observer.observe  # (the app's, fixed when it is built: no lookup per request)
    request_id = ids.of

    async def wrapped(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        rid = request[REQUEST_ID] = request_id(request)
        failure: Exception | None = None
        try:
            response = await handler(request)
        except Exception as exc:  # every failure is answered: error_response_for says how
            response = error_response_for(request, exc)
            failure = exc
        except asyncio.CancelledError:
            # The client left and aiohttp cancelled the handler. One whose headers had gone out
            # (a WebSocket its client closed, a stream cut short) was answered: count and log
            # it, then let the cancellation go on.
            prepared = request.get(PREPARED)
            if prepared is not None:
                record(request, prepared, started, rid)
            raise
        if response.status >= 400:
            # Every 4xx its input caused is counted here, once (a 416 is answered, not raised).
            reason = rejection_reason(response.status, failure)
            if reason is not None:
                request.app[keys.METRICS].bad_requests.labels(route, reason).inc()
        record(request, response, started, rid)
        return response

    def record(
        request: web.Request, response: web.StreamResponse, started: float, rid: str
    ) -> None:
        elapsed = time.perf_counter() - started
        get = request.get
        if response.prepared:
            # Streamed: its headers went out when the handler prepared it (gateway.http.delivery
            # notes when), and its body has been sent by now.
            ttfb = get(keys.FIRST_BYTE_AT, started + elapsed) - started
            sent = response.body_length
        else:
            # A plain response's headers and body go out right after this returns.
            ttfb = elapsed
            sent = response.content_length or 0
        observe(
            route,
            request.method,
            response.status,
            get(keys.CACHE_RESULT, "none"),
            get(keys.AUDIO_KEY),
            elapsed,
            sent,
            ttfb,
            get(keys.CLIENT_NAME),  # the API key's name, set by gateway.http.auth
            rid,
        )

    wrapped.__name__ = getattr(handler, "__name__", "handler")
    wrapped.__doc__ = handler.__doc__
    return wrapped


async def no_route(request: web.Request) -> web.StreamResponse:
    """Any path no route serves: 404 in the JSON error shape."""
    raise NotFound(f"no route for {clip(request.method, 24)} {clip(request.path, 128)}")


def method_not_allowed(allowed: Sequence[str], cors_headers: str) -> Handler:
    """A fallback for a path's other methods: 405 with ``Allow``; a CORS preflight from an
    allowed origin (``cors_origins``) is answered here too, since OPTIONS is such a method,
    allowing ``cors_headers``."""
    allow = ", ".join(allowed)

    async def not_allowed(request: web.Request) -> web.StreamResponse:
        if request.method == "OPTIONS":
            answer = preflight(request, request.app[keys.CORS_ORIGINS], allow, cors_headers)
            if answer is not None:
                return answer
        raise MethodNotAllowed(
            f"method {clip(request.method, 24)} not allowed on {clip(request.path, 128)} "
            f"(allowed: {allow})",
            allow=allow,
        )

    return not_allowed


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` (curl sends it for any body over 1 KiB): a body declared larger
    than ``max_body_kb`` is refused with 413 before the client is told to send it; aiohttp's own
    handler said "100 Continue" to every declared length, and the client began to upload. Else
    as aiohttp does: "100 Continue", or a 417 for an expectation we do not know (JSON here).
    """
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() != "100-continue":
        return error_response(BadRequest(f"unknown Expect: {clip(expect, 32)}"), status=417)
    limit = request.app[keys.MAX_BODY_BYTES]
    length = request.content_length
    if length is not None and length > limit:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        request.app[keys.METRICS].bad_requests.labels(route, "too_large").inc()
        return error_response(
            PayloadTooLarge(f"request body too large: {length} bytes (limit {limit})")
        )
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # (as aiohttp: the body proper has not started)
    return None


def add_routes(
    app: web.Application,
    routes: Sequence[Route],
    *,
    require_json: bool,
    allowed_hosts: frozenset[str],
    ids: RequestIds,
) -> None:
    """Register ``routes`` (gateway.http.routes), each handler wrapped once: behind its access
    check (:func:`gateway.http.auth.guarded`: none for an open route; with ``require_json``, a
    JSON Content-Type check for a JSON-only body), behind the Host allow-list when
    ``allowed_hosts`` is set, and by :func:`edge`. Every path answers its other methods with 405
    (and CORS preflights), and unknown paths get 404 (both counted as usual). The app's observer
    (``keys.OBSERVER``) must be set first; ``ids`` names the requests (gateway.http.app
    passes the ones its response-prepare stamp uses)."""

    def outer(handler: Handler) -> Handler:
        return host_checked(allowed_hosts, handler) if allowed_hosts else handler

    observer = app[keys.OBSERVER]
    methods: dict[str, list[str]] = {}
    for route in routes:
        inner = guarded(route.access, route.handler, json_body=require_json and route.json_only)
        wrapped = edge(route.path, outer(inner), observer, ids)
        if route.method == "GET":
            app.router.add_get(route.path, wrapped)
            methods.setdefault(route.path, []).extend(["GET", "HEAD"])
        else:
            app.router.add_route(route.method, route.path, wrapped, expect_handler=expect_continue)
            methods.setdefault(route.path, []).append(route.method)
    cors_headers = cors_request_headers(routes)
    for path, allowed in methods.items():
        fallback = method_not_allowed(allowed, cors_headers)
        app.router.add_route("*", path, edge(path, outer(fallback), observer, ids))
    app.router.add_route("*", "/{tail:.*}", edge("unmatched", outer(no_route), observer, ids))
