"""The aiohttp application: the route table, and the resources as cleanup contexts."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from gateway.api.parsing import RequestMemo
from gateway.api.say import SayMemo
from gateway.http import keys, listings, ops
from gateway.http.auth import ADMIN, ANY_KEY, METRICS, OPEN, READ, SIGNED, SPEAK
from gateway.http.compat import api_tts, piper_speak, piper_voices, synthesize
from gateway.http.edge import add_routes
from gateway.http.handlers import (
    audio_by_key,
    healthz,
    metrics_handler,
    readyz,
    speech,
    ssml_explain,
    studio,
    studio_ctx,
    voices,
)
from gateway.http.jambonz import jambonz_stream, jambonz_tts
from gateway.http.observe import RequestObserver
from gateway.http.openapi import openapi_handler
from gateway.http.origins import add_cors
from gateway.http.presentation import Presentations
from gateway.http.requestid import RequestIds, add_request_ids
from gateway.http.telephony import (
    AUDIO_EXT_ROUTE,
    SAY_ROUTE,
    SIGNED_SAY_ROUTE,
    audio_by_key_ext,
    say,
    say_signed,
    sign_say_url,
)
from gateway.runtime.accesslog import AccessLog
from gateway.runtime.apikeys import Authenticator, KeyedSockets
from gateway.runtime.buildinfo import record_build_info
from gateway.runtime.components import ModelSource, open_pins, open_speech
from gateway.runtime.hostshare import HostShares, open_host_table
from gateway.runtime.ratelimit import KeyLimits
from gateway.runtime.settings import Settings
from gateway.runtime.workers import WORKER_INDEX_ENV
from gateway.speech.assembly import RenderShare
from gateway.wyoming.server import WyomingServer
from metrics import Metrics

log = logging.getLogger("voxgate")

# Routes whose POST body is JSON only (require_json_content_type: 415 for anything else).
# /api/tts is not one: Coqui's clients send forms too.
JSON_BODIES = frozenset(
    {
        ("POST", "/v1/audio/speech"),
        ("POST", "/v1/ssml/explain"),
        ("POST", "/v1/prompts"),
        ("POST", "/v1/say/sign"),
        ("POST", "/v1/jambonz/tts"),
        ("POST", "/v1/ssml/explain"),
        ("POST", "/"),
    }
)


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address or ``localhost`` (reachable from this host only)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    engines: Mapping[str, ModelSource] | None = None,
) -> web.Application:
    """Build the gateway. ``engines`` replaces the configured engines (tests inject wrappers)."""
    max_body = settings.max_body_kb * 1024
    app = web.Application(client_max_size=max_body)
    app[keys.MAX_BODY_BYTES] = max_body
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics if metrics is not None else Metrics()
    app[keys.REQUEST_MEMO] = RequestMemo()
    app[keys.SAY_MEMO] = SayMemo()
    app[keys.PRESENTATIONS] = Presentations.from_settings(settings)
    app[keys.ACCESS_LOG] = AccessLog.from_settings(settings)
    app[keys.OBSERVER] = RequestObserver(app[keys.METRICS], app[keys.ACCESS_LOG])
    app[keys.AUTH] = Authenticator(settings.api_keys_file)
    app[keys.KEYED_SOCKETS] = KeyedSockets()
    app[keys.AUTH].on_reload.append(app[keys.KEYED_SOCKETS].rekey)
    app[keys.CORS_ORIGINS] = frozenset(settings.cors_origins)
    add_cors(app, app[keys.CORS_ORIGINS])
    request_ids = RequestIds()
    add_request_ids(app, request_ids)
    # The memory hit's own writer writes the request id and nothing else a receiver would add.
    app[keys.FAST_HITS] = len(app.on_response_prepare) == 1
    # With keys on and Redis configured, one budget per key across replicas (a lazy client:
    # nothing connects until a limited key is used).
    app[keys.LIMITS] = KeyLimits(
        app[keys.METRICS],
        redis_url=settings.redis_url.get_secret_value() if settings.api_keys_file else "",
        secret=settings.cache_secret.get_secret_value().encode(),
        prefix=settings.redis_prefix,
        timeout_s=settings.redis_timeout_ms / 1000,
        retry_redis_after_s=settings.redis_breaker_reset_ms / 1000,
    )

    async def host_ctx(app: web.Application) -> AsyncIterator[None]:
        # What the gateway processes of this host share without Redis (key budgets, queue
        # shares): the supervisor's table, or this process's own (a file is opened: off the loop).
        worker_index = int(os.environ.get(WORKER_INDEX_ENV, "0"))
        table = await asyncio.to_thread(open_host_table, worker_index)
        app[keys.HOST_TABLE] = table
        app[keys.LIMITS].host = table
        try:
            yield
        finally:
            app[keys.LIMITS].host = None
            table.close()

    async def auth_ctx(app: web.Application) -> AsyncIterator[None]:
        # Read off the loop; a keys file that cannot be used stops the start (serve checks it
        # earlier, so its error names the file rather than a traceback).
        ring = await app[keys.AUTH].load()
        await app[keys.LIMITS].start()
        if ring is not None:
            log.info(
                "API keys on: %d keys from %s (reloaded on SIGHUP)",
                len(ring.keys),
                settings.api_keys_file,
            )
        else:
            # Beyond loopback, `voxgate serve`'s "listening on" line says so as a warning.
            log.info("no API keys file: every route is open (api_keys_file)")
        try:
            yield
        finally:
            await app[keys.LIMITS].close()

    async def access_log_ctx(app: web.Application) -> AsyncIterator[None]:
        # The version comes from package metadata (a filesystem scan): not on the loop.
        await asyncio.to_thread(record_build_info, app[keys.METRICS])
        app[keys.ACCESS_LOG].start()
        yield
        app[keys.OBSERVER].close()
        await app[keys.ACCESS_LOG].close()

    async def speech_ctx(app: web.Application) -> AsyncIterator[None]:
        metrics = app[keys.METRICS]
        shares = HostShares(app[keys.HOST_TABLE], metrics.host_table_full.inc)
        async with (
            open_speech(settings, metrics, engines, shares=shares) as service,
            open_pins(settings, service.store) as pins,
        ):
            app[keys.SPEECH] = service
            app[keys.PINS] = pins
            share = RenderShare(shares, settings.renders_per_client, metrics.renders_refused)
            service.assembler.render_share = service.transcoder.render_share = share
            if settings.api_keys_file:
                service.admit_synthesis = app[keys.LIMITS].admit_synthesis
            app[keys.STORE] = service.store
            yield

    async def wyoming_ctx(app: web.Application) -> AsyncIterator[None]:
        # Home Assistant's protocol (issue 15), off unless a port is set; the same service.
        server = WyomingServer(
            app[keys.SPEECH],
            settings,
            app[keys.METRICS],
            reuse_port=os.environ.get(WORKER_INDEX_ENV) is not None,
        )
        try:
            await server.start()
        except BaseException:
            await server.close()  # (a port bound before the failure is not left open)
            raise
        app[keys.WYOMING] = server
        try:
            yield
        finally:
            await server.close()

    app.cleanup_ctx.append(host_ctx)
    app.cleanup_ctx.append(auth_ctx)
    app.cleanup_ctx.append(access_log_ctx)
    app.cleanup_ctx.append(speech_ctx)
    app.cleanup_ctx.append(studio_ctx)
    if settings.wyoming_port:
        app.cleanup_ctx.append(wyoming_ctx)
    add_routes(
        app,
        [
            ("POST", "/v1/audio/speech", speech, SPEAK),
            ("POST", "/v1/ssml/explain", ssml_explain, SPEAK),
            # --- listings (issue 15); before /v1/audio/{key}, which would match them ---
            ("GET", "/v1/models", listings.openai_models, ANY_KEY),
            ("GET", "/v1/audio/models", listings.audio_models, ANY_KEY),
            ("GET", "/v1/audio/voices", listings.audio_voices, ANY_KEY),
            # (also before /v1/audio/{key}, whose segment would take "{key}.{ext}" whole)
            ("GET", AUDIO_EXT_ROUTE, audio_by_key_ext, READ),
            ("GET", "/v1/audio/{key}", audio_by_key, READ),
            ("GET", "/v1/voices", voices, ANY_KEY),
            ("GET", "/healthz", healthz, OPEN),
            ("GET", "/readyz", readyz, OPEN),
            ("GET", "/metrics", metrics_handler, METRICS if settings.metrics_auth else OPEN),
            # --- compatible endpoints and the API description (issue 5) ---
            ("GET", "/api/tts", api_tts, SPEAK),
            ("POST", "/api/tts", api_tts, SPEAK),
            ("GET", "/synthesize", synthesize, SPEAK),
            ("GET", "/openapi.json", openapi_handler, OPEN),
            # --- operations (issue 6) ---
            ("POST", "/v1/prompts", ops.prompts, ADMIN),
            ("GET", "/v1/prompts", ops.pinned_prompts, ANY_KEY),
            # --- Piper's HTTP API (issue 15): POST only; GET / is the prompt studio (issue 16),
            # a page open to all that calls the API with the key typed into it ---
            ("POST", "/", piper_speak, SPEAK),
            ("GET", "/", studio, OPEN),
            ("GET", "/voices", piper_voices, ANY_KEY),
            # --- telephony (issue 14) ---
            ("GET", SAY_ROUTE, say, SPEAK),
            ("GET", SIGNED_SAY_ROUTE, say_signed, SIGNED),
            ("POST", "/v1/say/sign", sign_say_url, SPEAK),
            ("POST", "/v1/jambonz/tts", jambonz_tts, SPEAK),
            ("GET", "/v1/jambonz/stream", jambonz_stream, SPEAK),
        ],
        json_bodies=JSON_BODIES if settings.require_json_content_type else frozenset(),
        allowed_hosts=frozenset(settings.allowed_hosts),
        request_ids=request_ids,
    )
    return app


async def wait_ready(app: web.Application) -> None:
    """Wait until every model of a started app is warm."""
    for handle in app[keys.SPEECH].models.values():
        await handle.ready.wait()
