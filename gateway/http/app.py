"""The aiohttp application: the routes of the route table (gateway.http.routes), and the
resources as cleanup contexts."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping

from aiohttp import web

from gateway.api.parsing import ExpansionMemo, RequestMemo
from gateway.api.say import SayMemo
from gateway.http import keys
from gateway.http.edge import add_routes
from gateway.http.handlers import studio_ctx
from gateway.http.hits import FastPath
from gateway.http.observe import RequestObserver
from gateway.http.openapi import render
from gateway.http.origins import add_cors, served_hosts
from gateway.http.presentation import Presentations
from gateway.http.requestid import RequestIds, add_request_ids
from gateway.http.routes import route_table
from gateway.http.routing import RouteTable, cors_response_headers
from gateway.runtime.accesslog import AccessLog
from gateway.runtime.apikeys import Authenticator, KeyedSockets
from gateway.runtime.buildinfo import record_build_info
from gateway.runtime.components import ModelSource, open_pins, open_speech
from gateway.runtime.hostshare import HostShares, open_host_table
from gateway.runtime.ratelimit import KeyLimits
from gateway.runtime.settings import Settings
from gateway.runtime.workers import WORKER_INDEX_ENV
from gateway.speech.rollout import keep_following_revisions
from gateway.speech.streamslots import ClientSlots
from gateway.wyoming.server import WyomingServer
from metrics import Metrics
from synth.cancellation import cancel_and_wait

log = logging.getLogger("voxgate")


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    engines: Mapping[str, ModelSource] | None = None,
    routes: RouteTable | None = None,
) -> web.Application:
    """Build the gateway. ``engines`` replaces the configured engines (tests inject wrappers);
    ``routes`` the route table (default: :func:`gateway.http.routes.route_table`)."""
    table = route_table(settings) if routes is None else routes
    max_body = settings.max_body_kb * 1024
    app = web.Application(client_max_size=max_body)
    app[keys.MAX_BODY_BYTES] = max_body
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics if metrics is not None else Metrics()
    app[keys.REQUEST_MEMO] = RequestMemo()
    app[keys.EXPANSIONS] = ExpansionMemo()
    app[keys.SAY_MEMO] = SayMemo()
    app[keys.PRESENTATIONS] = Presentations.from_settings(settings)
    app[keys.ACCESS_LOG] = AccessLog.from_settings(settings)
    app[keys.OBSERVER] = RequestObserver(app[keys.METRICS], app[keys.ACCESS_LOG])
    app[keys.AUTH] = Authenticator(settings.api_keys_file)
    app[keys.KEYED_SOCKETS] = KeyedSockets()
    app[keys.STREAM_SLOTS] = ClientSlots(
        min(
            settings.renders_per_client,
            max(settings.queue_per_client, settings.max_parallel_sentences),
        ),
        settings.batch_timeout_s,
    )
    app[keys.AUTH].on_reload.append(app[keys.KEYED_SOCKETS].rekey)
    app[keys.CORS_ORIGINS] = frozenset(settings.cors_origins)
    add_cors(app, app[keys.CORS_ORIGINS], cors_response_headers(table))
    app[keys.ROUTES] = table
    # Rendered on first use, then kept: the settings and routes are the app's for life.
    document: Callable[[], bytes] = functools.cache(lambda: render(settings, table).encode())
    app[keys.OPENAPI] = document
    request_ids = RequestIds()
    add_request_ids(app, request_ids)
    # The hit writer (with fast_path) writes the request id, nothing else a receiver would add.
    app[keys.FAST_HITS] = settings.fast_path and len(app.on_response_prepare) == 1
    # `voxgate serve` installs it on its server.
    fast = FastPath(
        app[keys.OBSERVER].observe,
        request_ids,
        lambda: app[keys.AUTH].ring is None,
        counter=app[keys.METRICS].fast_hits,
    )
    app[keys.METRICS].before_collect(fast.flush)
    app[keys.FAST_PATH] = fast
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
            open_speech(
                settings,
                metrics,
                engines,
                shares=shares,
                admit_synthesis=app[keys.LIMITS].admit_synthesis
                if settings.api_keys_file
                else None,
            ) as service,
            open_pins(settings, service.store) as pins,
        ):
            app[keys.SPEECH] = service
            app[keys.VOCABULARY] = service.vocabulary
            app[keys.PINS] = pins
            app[keys.STORE] = service.store
            # open_speech applied the revisions at start; this follows later switches.
            refresh = settings.revision_refresh_s
            follower = (
                asyncio.ensure_future(keep_following_revisions(service, pins, refresh))
                if refresh > 0
                else None
            )
            try:
                yield
            finally:
                if follower is not None:
                    await cancel_and_wait(follower)

    async def wyoming_ctx(app: web.Application) -> AsyncIterator[None]:
        # Home Assistant's protocol, off unless a port is set; the same service.
        server = WyomingServer(
            app[keys.SPEECH],
            settings,
            app[keys.METRICS],
            reuse_port=os.environ.get(WORKER_INDEX_ENV) is not None or settings.share_port,
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

    app.cleanup_ctx.extend([host_ctx, auth_ctx, access_log_ctx, speech_ctx, studio_ctx])
    if settings.wyoming_port:
        app.cleanup_ctx.append(wyoming_ctx)
    add_routes(
        app,
        table.routes,
        require_json=settings.require_json_content_type,
        allowed_hosts=served_hosts(settings.allowed_hosts, settings.host),
        ids=request_ids,
    )
    return app


async def wait_ready(app: web.Application) -> None:
    """Wait until every model of a started app is warm."""
    for handle in app[keys.SPEECH].models.values():
        await handle.ready.wait()
