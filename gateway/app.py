"""The aiohttp application: routes, middlewares, and the resources as cleanup contexts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from cache.keys import is_key
from gateway import keys, ops
from gateway.accesslog import AccessLog
from gateway.compat import api_tts, synthesize
from gateway.components import open_speech
from gateway.delivery import serve_speech, serve_stored
from gateway.errors import BadRequest, Handler, NotFound, handle_errors
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


# ---- middleware ---------------------------------------------------------------------------


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one middleware: maps every failure to a JSON error (the server keeps serving), then
    counts, times and logs the request (one JSON access-log line, never the text)."""
    started = time.perf_counter()
    response = await handle_errors(request, handler)
    elapsed = time.perf_counter() - started
    if response.prepared:
        # Streamed: its headers went out when the handler prepared it (gateway.delivery notes
        # when), and its body has been sent by now.
        ttfb = request.get(keys.FIRST_BYTE_AT, started + elapsed) - started
        sent = response.body_length
    else:
        # A plain response's headers and body go out right after this returns. (Timing it here
        # rather than in an on_response_prepare signal saves a coroutine per request.)
        ttfb = elapsed
        sent = response.content_length or 0
    resource = request.match_info.route.resource
    request.app[keys.OBSERVER].observe(
        route=resource.canonical if resource is not None else "unmatched",
        method=request.method,
        status=response.status,
        cache=request.get(keys.CACHE_RESULT, "none"),
        key=request.get(keys.AUDIO_KEY),
        seconds=elapsed,
        ttfb=ttfb,
        nbytes=sent,
        client=request.get(keys.CLIENT_ID),
    )
    return response


# ---- assembly -----------------------------------------------------------------------------


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    engines: Mapping[str, Engine] | None = None,
) -> web.Application:
    """Build the gateway. ``engines`` replaces the configured engines (tests inject wrappers)."""
    max_body = settings.max_body_kb * 1024
    app = web.Application(
        client_max_size=max_body, middlewares=[edge_middleware]
    )
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
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/{key}", audio_by_key)
    app.router.add_get("/v1/voices", voices)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    # --- compatible endpoints and the API description (issue 5) ---
    app.router.add_get("/api/tts", api_tts)
    app.router.add_post("/api/tts", api_tts)
    app.router.add_get("/synthesize", synthesize)
    app.router.add_get("/openapi.json", openapi_handler)
    # --- operations (issue 6) ---
    app.router.add_post("/v1/prompts", ops.prompts)
    return app


async def wait_ready(app: web.Application) -> None:
    """Wait until every model of a started app is warm."""
    for handle in app[keys.SPEECH].models.values():
        await handle.ready.wait()
