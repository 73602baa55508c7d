"""The aiohttp application: the route table, and the resources as cleanup contexts."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence

from aiohttp import web

from gateway.api.parsing import RequestMemo
from gateway.api.say import SayMemo
from gateway.http import keys, listings, ops
from gateway.http.compat import api_tts, piper_speak, piper_voices, synthesize
from gateway.http.edge import add_routes
from gateway.http.handlers import audio_by_key, healthz, metrics_handler, readyz, speech, voices
from gateway.http.jambonz import jambonz_stream, jambonz_tts
from gateway.http.observe import RequestObserver
from gateway.http.openapi import openapi_handler
from gateway.http.presentation import Presentations
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
from gateway.runtime.buildinfo import record_build_info
from gateway.runtime.components import open_speech
from gateway.runtime.settings import Settings
from gateway.runtime.workers import WORKER_INDEX_ENV
from gateway.wyoming.server import WyomingServer
from metrics import Metrics
from synth.engine import Engine
from synth.pool import EngineSpec


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
    app[keys.SAY_MEMO] = SayMemo()
    app[keys.PRESENTATIONS] = Presentations.from_settings(settings)
    app[keys.ACCESS_LOG] = AccessLog.from_settings(settings)
    app[keys.OBSERVER] = RequestObserver(app[keys.METRICS], app[keys.ACCESS_LOG])

    async def access_log_ctx(app: web.Application) -> AsyncIterator[None]:
        # The version comes from package metadata (a filesystem scan): not on the loop.
        await asyncio.to_thread(record_build_info, app[keys.METRICS])
        app[keys.ACCESS_LOG].start()
        yield
        app[keys.OBSERVER].close()
        await app[keys.ACCESS_LOG].close()

    async def speech_ctx(app: web.Application) -> AsyncIterator[None]:
        async with open_speech(settings, app[keys.METRICS], engines) as service:
            app[keys.SPEECH] = service
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
        await server.start()
        app[keys.WYOMING] = server
        try:
            yield
        finally:
            await server.close()

    app.cleanup_ctx.append(access_log_ctx)
    app.cleanup_ctx.append(speech_ctx)
    if settings.wyoming_port:
        app.cleanup_ctx.append(wyoming_ctx)
    add_routes(
        app,
        [
            ("POST", "/v1/audio/speech", speech),
            # --- listings (issue 15); before /v1/audio/{key}, which would match them ---
            ("GET", "/v1/models", listings.openai_models),
            ("GET", "/v1/audio/models", listings.audio_models),
            ("GET", "/v1/audio/voices", listings.audio_voices),
            # (also before /v1/audio/{key}, whose segment would take "{key}.{ext}" whole)
            ("GET", AUDIO_EXT_ROUTE, audio_by_key_ext),
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
            # --- Piper's HTTP API (issue 15): POST only, GET / is left to other pages ---
            ("POST", "/", piper_speak),
            ("GET", "/voices", piper_voices),
            # --- telephony (issue 14) ---
            ("GET", SAY_ROUTE, say),
            ("GET", SIGNED_SAY_ROUTE, say_signed),
            ("POST", "/v1/say/sign", sign_say_url),
            ("POST", "/v1/jambonz/tts", jambonz_tts),
            ("GET", "/v1/jambonz/stream", jambonz_stream),
        ],
    )
    return app


async def wait_ready(app: web.Application) -> None:
    """Wait until every model of a started app is warm."""
    for handle in app[keys.SPEECH].models.values():
        await handle.ready.wait()
