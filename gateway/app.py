"""The aiohttp application: routes, middlewares, and the resources as cleanup contexts."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from aiohttp import web

from cache.keys import is_key
from gateway import keys
from gateway.components import open_speech
from gateway.errors import BadRequest, Handler, NotFound, error_middleware
from gateway.parsing import parse_openai_speech, read_json_object
from gateway.settings import Settings
from gateway.speech import SpeechResult
from metrics import CONTENT_TYPE_LATEST, Metrics, exposition
from synth.engine import Engine
from synth.pool import EngineSpec

access_log = logging.getLogger("voxgate.access")

IMMUTABLE = "public, max-age=31536000, immutable"


def audio_response(result: SpeechResult) -> web.Response:
    """The HTTP response carrying ``result``'s audio."""
    entry = result.entry
    return web.Response(
        body=entry.audio,
        headers={
            "Content-Type": entry.meta.content_type,
            "X-Cache": result.cache.upper(),
            "X-Audio-Key": result.key,
            "ETag": f'"{result.key}"',
            "X-Audio-Sample-Rate": str(entry.meta.sample_rate),
        },
    )


# ---- handlers -----------------------------------------------------------------------------


async def speech(request: web.Request) -> web.Response:
    """``POST /v1/audio/speech``: OpenAI-compatible text to speech."""
    app = request.app
    settings = app[keys.SETTINGS]
    service = app[keys.SPEECH]
    body = await read_json_object(request, settings.max_body_kb * 1024)
    req = parse_openai_speech(body, settings, service)
    result = await service.speak(req)
    request[keys.CACHE_RESULT] = result.cache
    request[keys.AUDIO_KEY] = result.key
    app[keys.METRICS].speech_requests.labels(req.model, req.voice, req.fmt.name, result.cache).inc()
    return audio_response(result)


async def audio_by_key(request: web.Request) -> web.Response:
    """``GET /v1/audio/{key}``: stored audio by content address (immutable)."""
    key = request.match_info["key"]
    if not is_key(key):
        raise BadRequest("malformed audio key: expected 64 lowercase hex digits", param="key")
    store = request.app[keys.STORE]
    entry = store.get_memory(key)
    if entry is None:
        found = await store.get(key)
        if found is None:
            raise NotFound(f"no audio stored under key {key}", param="key")
        entry = found.entry
    request[keys.CACHE_RESULT] = "hit"
    request[keys.AUDIO_KEY] = key
    etag = f'"{key}"'
    headers = {"ETag": etag, "Cache-Control": IMMUTABLE, "Content-Type": entry.meta.content_type}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    return web.Response(body=entry.audio, headers=headers)


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
    """``GET /readyz``: 200 once every model is loaded and warmed, else 503."""
    service = request.app.get(keys.SPEECH)
    models = {name: h.ready.is_set() for name, h in service.models.items()} if service else {}
    ready = bool(models) and all(models.values())
    tiers = [t.name for t in service.store.tiers] if service else []
    return web.json_response(
        {"status": "ready" if ready else "loading", "models": models, "tiers": tiers},
        status=200 if ready else 503,
    )


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
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time every request; write one JSON access-log line (never the text)."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        elapsed = time.perf_counter() - started
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        cache = request.get(keys.CACHE_RESULT, "none")
        m = request.app[keys.METRICS]
        m.requests.labels(route, request.method, str(status)).inc()
        m.request_seconds.labels(route, cache).observe(elapsed)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                json.dumps(
                    {
                        "route": route,
                        "method": request.method,
                        "status": status,
                        "key": request.get(keys.AUDIO_KEY),
                        "cache": cache,
                        "ms": round(elapsed * 1000, 3),
                    }
                )
            )


# ---- assembly -----------------------------------------------------------------------------


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    engines: Mapping[str, Engine | Sequence[EngineSpec]] | None = None,
) -> web.Application:
    """Build the gateway. ``engines`` replaces the configured engines (tests inject wrappers)."""
    max_body = settings.max_body_kb * 1024
    app = web.Application(
        client_max_size=max_body, middlewares=[observe_middleware, error_middleware]
    )
    app[keys.MAX_BODY_BYTES] = max_body
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics if metrics is not None else Metrics()

    async def speech_ctx(app: web.Application) -> AsyncIterator[None]:
        async with open_speech(settings, app[keys.METRICS], engines) as service:
            app[keys.SPEECH] = service
            app[keys.STORE] = service.store
            yield

    app.cleanup_ctx.append(speech_ctx)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/{key}", audio_by_key)
    app.router.add_get("/v1/voices", voices)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app


async def wait_ready(app: web.Application) -> None:
    """Wait until every model of a started app is warm."""
    for handle in app[keys.SPEECH].models.values():
        await handle.ready.wait()
