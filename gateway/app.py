"""The aiohttp application: routes, middlewares, and the resources as cleanup contexts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from aiohttp import web

from cache.keys import is_key
from gateway import keys, ops
from gateway.accesslog import AccessLog
from gateway.compat import api_tts, synthesize
from gateway.components import open_speech
from gateway.delivery import serve_speech, serve_stored
from gateway.errors import (
    BadRequest,
    Handler,
    MethodNotAllowed,
    NotFound,
    error_response_for,
)
from gateway.observe import RequestObserver
from gateway.openapi import openapi_handler
from gateway.parsing import (
    RequestMemo,
    parse_json_object,
    parse_openai_speech,
    parse_stream,
    read_body,
)
from gateway.settings import Settings
from metrics import CONTENT_TYPE_LATEST, Metrics, exposition
from synth.engine import Engine
from synth.pool import EngineSpec

# ---- handlers -----------------------------------------------------------------------------


async def speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech``: OpenAI-compatible text to speech."""
    app = request.app
    settings = app[keys.SETTINGS]
    service = app[keys.SPEECH]
    raw = await read_body(request, settings.max_body_kb * 1024)
    memo = app[keys.REQUEST_MEMO]
    parsed = memo.get(raw)
    if parsed is None:
        body = parse_json_object(raw)
        req = parse_openai_speech(body, settings, service)
        parsed = (req, parse_stream(body, req.fmt))
        memo.put(raw, parsed)
    req, stream = parsed
    # ETag / If-None-Match, Content-Length, and streaming: gateway.delivery.
    return await serve_speech(request, req, stream=stream)


async def audio_by_key(request: web.Request) -> web.StreamResponse:
    """``GET /v1/audio/{key}``: stored audio by content address (immutable; 304, Range/206)."""
    key = request.match_info["key"]
    if not is_key(key):
        raise BadRequest("malformed audio key: expected 64 lowercase hex digits", param="key")
    response = await serve_stored(request, key)
    if response is None:
        raise NotFound(f"no audio stored under key {key}", param="key")
    return response


async def voices(request: web.Request) -> web.Response:
    """``GET /v1/voices``: models, their voices, and the accepted aliases."""
    settings = request.app[keys.SETTINGS]
    return web.json_response(
        {
            "models": list(request.app[keys.SPEECH].voice_listing()),
            "model_aliases": settings.model_aliases,
            "voice_aliases": settings.voice_aliases,
        }
    )


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: the process is alive."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 once every model is warmed, else 503; each tier's state in the body."""
    status, body = await ops.readiness(request.app)
    return web.json_response(body, status=status)


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text exposition."""
    m = request.app[keys.METRICS]
    service = request.app.get(keys.SPEECH)
    if service is not None:
        await service.store.stats()
    resp = web.Response(body=exposition(m.registry))
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp


# ---- the edge: errors, counting, timing, logging ------------------------------------------


def edge(route: str, handler: Handler) -> Handler:
    """Wrap ``handler`` (registered under the template ``route``): every failure becomes a JSON
    error (the server keeps serving), and every request is counted, timed and logged (one JSON
    access-log line, never the text).

    This wraps each route rather than being an aiohttp middleware: with any middleware at all,
    aiohttp builds a chain and adds a frame of its own to every request, which was a tenth of a
    cache hit's CPU time. Unknown paths and methods reach wrapped fallback routes instead
    (:func:`add_routes`), so they are answered and counted the same way.
    """

    async def wrapped(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except Exception as exc:  # every failure is answered: error_response_for says how
            response = error_response_for(request, exc)
        elapsed = time.perf_counter() - started
        if response.prepared:
            # Streamed: its headers went out when the handler prepared it (gateway.delivery
            # notes when), and its body has been sent by now.
            ttfb = request.get(keys.FIRST_BYTE_AT, started + elapsed) - started
            sent = response.body_length
        else:
            # A plain response's headers and body go out right after this returns.
            ttfb = elapsed
            sent = response.content_length or 0
        get = request.get
        # (The access log's client field stays null until authentication sets one.)
        request.app[keys.OBSERVER].observe(
            route=route,
            method=request.method,
            status=response.status,
            cache=get(keys.CACHE_RESULT, "none"),
            key=get(keys.AUDIO_KEY),
            seconds=elapsed,
            ttfb=ttfb,
            nbytes=sent,
        )
        return response

    wrapped.__name__ = getattr(handler, "__name__", "handler")
    wrapped.__doc__ = handler.__doc__
    return wrapped


async def no_route(request: web.Request) -> web.StreamResponse:
    """Any path no route serves: 404 in the JSON error shape."""
    raise NotFound(f"no route for {request.method} {request.path}")


def method_not_allowed(allowed: Sequence[str]) -> Handler:
    """A fallback for a path's other methods: 405 with ``Allow``."""
    allow = ", ".join(allowed)

    async def not_allowed(request: web.Request) -> web.StreamResponse:
        raise MethodNotAllowed(
            f"method {request.method} not allowed on {request.path} (allowed: {allow})",
            allow=allow,
        )

    return not_allowed


def add_routes(app: web.Application, routes: Sequence[tuple[str, str, Handler]]) -> None:
    """Register ``(method, path, handler)`` routes, each wrapped by :func:`edge`; every path
    answers its other methods with 405, and unknown paths get 404 (both counted as usual)."""
    methods: dict[str, list[str]] = {}
    for method, path, handler in routes:
        if method == "GET":
            app.router.add_get(path, edge(path, handler))
            methods.setdefault(path, []).extend(["GET", "HEAD"])
        else:
            app.router.add_route(method, path, edge(path, handler))
            methods.setdefault(path, []).append(method)
    for path, allowed in methods.items():
        app.router.add_route("*", path, edge(path, method_not_allowed(allowed)))
    app.router.add_route("*", "/{tail:.*}", edge("unmatched", no_route))


# ---- assembly -----------------------------------------------------------------------------


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    engines: Mapping[str, Engine | Sequence[EngineSpec]] | None = None,
) -> web.Application:
    """Build the gateway. ``engines`` replaces the configured engines (tests inject wrappers)."""
    max_body = settings.max_body_kb * 1024
    app = web.Application(client_max_size=max_body)
    app[keys.MAX_BODY_BYTES] = max_body
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics if metrics is not None else Metrics()
    app[keys.REQUEST_MEMO] = RequestMemo()
    app[keys.ACCESS_LOG] = AccessLog.from_settings(settings)
    app[keys.OBSERVER] = RequestObserver(app[keys.METRICS], app[keys.ACCESS_LOG])

    async def access_log_ctx(app: web.Application) -> AsyncIterator[None]:
        # The version comes from package metadata (a filesystem scan): not on the loop.
        await asyncio.to_thread(ops.record_build_info, app[keys.METRICS])
        app[keys.ACCESS_LOG].start()
        yield
        await app[keys.ACCESS_LOG].close()

    async def speech_ctx(app: web.Application) -> AsyncIterator[None]:
        async with open_speech(settings, app[keys.METRICS], engines) as service:
            app[keys.SPEECH] = service
            app[keys.STORE] = service.store
            yield

    app.cleanup_ctx.append(access_log_ctx)
    app.cleanup_ctx.append(speech_ctx)
    add_routes(
        app,
        [
            ("POST", "/v1/audio/speech", speech),
            ("GET", "/v1/audio/{key}", audio_by_key),
            ("GET", "/v1/voices", voices),
            ("GET", "/healthz", healthz),
            ("GET", "/readyz", readyz),
            ("GET", "/metrics", metrics_handler),
            # --- compatible endpoints and the API description (issue 5) ---
            ("GET", "/api/tts", api_tts),
            ("POST", "/api/tts", api_tts),
            ("GET", "/synthesize", synthesize),
            ("GET", "/openapi.json", openapi_handler),
            # --- operations (issue 6) ---
            ("POST", "/v1/prompts", ops.prompts),
        ],
    )
    return app


async def wait_ready(app: web.Application) -> None:
    """Wait until every model of a started app is warm."""
    for handle in app[keys.SPEECH].models.values():
        await handle.ready.wait()
