"""``voxgate serve``: run the HTTP gateway (one process, or N supervised ones on one port)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from gateway.cli.common import add_setting_flags, command, load_settings
from gateway.runtime.ports import check_port, hold_port, in_use, listened_ports
from gateway.runtime.settings import Settings, SettingsError

log = logging.getLogger("voxgate")


async def _serve(settings: Settings, worker_of: int | None = None) -> None:
    from aiohttp import web

    from gateway.http import keys
    from gateway.http.app import create_app, wait_ready
    from gateway.http.connections import (
        cap_connections,
        ops_server,
        plain_refusals,
        runner_options,
    )
    from gateway.http.handlers import metrics_response
    from gateway.http.hits import answer_repeats, lift_writelines_skip
    from gateway.http.origins import is_loopback

    # Headers and body in one writev on uvloop where safe; fast path off: aiohttp as it ships.
    if settings.fast_path:
        lift_writelines_skip(asyncio.get_running_loop())
    app = create_app(settings)
    # On SIGTERM, runner.cleanup() stops listening, lets in-flight requests finish for up to
    # shutdown_timeout_s, then runs the cleanup contexts (schedulers, engines, tiers) in reverse.
    # handler_cancellation: a client that hangs up cancels its handler, so a miss nobody waits
    # for any more stops its synthesis (gateway.speech.assembly); aiohttp's test server does this
    # by default, its AppRunner does not.
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=settings.shutdown_timeout_s,
        handler_cancellation=True,
        **runner_options(settings),
    )
    try:
        await runner.setup()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or not settings.wyoming_port:
            raise
        # Taken between the start's check and this bind.
        raise in_use(settings.wyoming_port, "Wyoming") from None
    assert runner.server is not None  # (set by setup())
    probes = app[keys.ROUTES].probe_paths
    cap_connections(
        runner.server,
        settings.max_connections,
        app[keys.METRICS],
        probes,
        per_source=settings.max_unfinished_per_source,
    )
    plain_refusals(runner.server)
    if app[keys.FAST_HITS]:
        answer_repeats(runner.server, app[keys.FAST_PATH])
    # A worker of `serve --workers N` shares the port with its siblings (SO_REUSEPORT); the
    # supervisor's check and held socket keep anyone else out (gateway.runtime.ports).
    shared = worker_of is not None or settings.share_port
    site = web.TCPSite(runner, settings.host, settings.port, reuse_port=shared)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[bool]] = set()

    def reload_keys() -> None:
        # The files are read off the loop; the tasks are kept until done (the loop holds only a
        # weak reference to them).
        jobs = [app[keys.AUTH].reload()]
        if settings.upstreams_file:
            from gateway.runtime.upstreams import reload_upstreams

            jobs.append(reload_upstreams(settings, app[keys.SPEECH].models))
        for job in jobs:
            task = asyncio.ensure_future(job)
            reloads.add(task)
            task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload_keys)
    orphan_watch = None
    if worker_of is not None:
        from gateway.runtime.workers import watch_parent

        orphan_watch = asyncio.ensure_future(watch_parent(worker_of, stop))
    ready = asyncio.ensure_future(wait_ready(app))
    stopped = asyncio.ensure_future(stop.wait())
    if worker_of is not None:
        # A worker listens only once it can answer: the kernel spreads connections over every
        # socket on the port, and one still loading would turn away with 503 what a ready sibling
        # serves (the host's pool is shared, so a worker is ready about as soon as its siblings).
        # A lone server listens at once, so that /readyz can say it is loading.
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    ops_runner = None
    if settings.ops_port:
        ops_runner = web.ServerRunner(
            ops_server(app, settings, probes, metrics_response),
            handle_signals=False,
            shutdown_timeout=1.0,
        )
        await ops_runner.setup()
    try:
        if ops_runner is not None:
            ops_host = settings.ops_host or settings.host
            ops_site = web.TCPSite(ops_runner, ops_host, settings.ops_port, reuse_port=shared)
            await _listen(ops_site, settings.ops_port, "ops")
        await _listen(site, settings.port, "HTTP")
    except BaseException:
        if ops_runner is not None:
            await ops_runner.cleanup()
        await runner.cleanup()
        raise
    addresses = [f"http://{host}:{port}" for host, port, *_ in runner.addresses]
    from gateway.runtime.eventloop import describe

    listening = ", ".join(addresses) or site.name
    loading = "" if ready.done() else "; loading models"
    if settings.api_keys_file or is_loopback(settings.host):
        log.info("listening on %s (event loop: %s)%s", listening, describe(loop), loading)
    else:
        # Open is right for a laptop on loopback; anywhere else it is a door left open.
        log.warning(
            "listening on %s (event loop: %s)%s, beyond loopback with no API keys: anyone who "
            "reaches this address can synthesize, pin prompts and read metrics (set "
            "api_keys_file; docs/security.md)",
            listening,
            describe(loop),
            loading,
        )
    await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():
        # What start-up made (modules, models' tables, the app) lives as long as the process:
        # out of the collector's sight, a full collection no longer walks it (about 25 ms for
        # a gateway's 100,000 objects, a pause every request in flight would wait out).
        gc.freeze()
        log.info("voxgate ready on %s (cache: %s)", listening, settings.cache_dir)
        await stopped
    else:
        ready.cancel()
    if orphan_watch is not None:
        orphan_watch.cancel()
    log.info("shutting down: draining in-flight requests (up to %ss)", settings.shutdown_timeout_s)
    if ops_runner is not None:
        await ops_runner.cleanup()
    await runner.cleanup()
    log.info("stopped")


async def _listen(site: Any, port: int, what: str) -> None:
    try:
        await site.start()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        # Taken between the start's check and this bind.
        raise in_use(port, what) from None


def init_keys_file(settings: Settings) -> None:
    """``api_keys_init``: make the keys file if there is none; show its admin secret on stderr."""
    from gateway.runtime.apikeys import INIT_ADMIN, KeysFileError, create_keys_file

    path = settings.api_keys_file
    if not path:
        raise SettingsError("setting 'api_keys_init': needs api_keys_file (where to make it)")
    try:
        secret = create_keys_file(path, settings.api_keys_init_metrics_secret.get_secret_value())
    except (KeysFileError, OSError) as exc:
        raise SettingsError(f"setting 'api_keys_init': {exc}") from None
    if secret is None:
        return
    # Printed on stderr, not logged: no log line ever carries a secret, and this is the one time
    # this one is shown (a container's output keeps it: read it there, then hand it over).
    print(
        f"voxgate: made the API keys file {path} with the key {INIT_ADMIN!r} (scopes admin, "
        f"speak, read). Its secret, shown only now:\n\n    {secret}\n\nAdd keys with "
        f"`voxgate keys add NAME --scopes speak --file {path}`, then SIGHUP the gateway.",
        file=sys.stderr,
        flush=True,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.runtime.extras import check_extras, check_upstreams
    from gateway.runtime.logs import configure_logging

    settings = load_settings(args)
    # Before any process starts: `--workers N` would otherwise start N servers that each fail.
    check_extras(settings)
    check_upstreams(settings)
    if settings.api_keys_init and args.worker_of is None and not args.serve_pool:
        init_keys_file(settings)
    if settings.api_keys_file:
        from gateway.runtime.apikeys import KeyRing, KeysFileError

        try:
            KeyRing.load(settings.api_keys_file)
        except KeysFileError as exc:
            raise SettingsError(f"setting 'api_keys_file': {exc}") from None
    configure_logging(settings.log_level, settings.log_format)
    topology = settings.topology()
    if args.worker_of is None:
        # What `auto` became here and why: the numbers a newcomer's `voxgate serve` runs with.
        log.info("topology: %s", topology.describe())
    from gateway.runtime import eventloop

    # Before any process starts, as for the extras: N workers would each fail on it instead.
    try:
        eventloop.resolve(settings.event_loop)
    except eventloop.EventLoopUnavailable as exc:
        raise SettingsError(f"setting 'event_loop': {exc}") from exc
    supervisor = topology.gateway_processes > 1 and args.worker_of is None and not args.serve_pool
    if not supervisor:
        # A process that serves (a gateway or the pool host): before its threads start.
        from gateway.runtime.heap import tune_malloc

        log.debug("malloc set up: %s", tune_malloc() or "as the environment or platform has it")
    if args.serve_pool:
        from gateway.runtime.poolhost import serve_pool

        eventloop.run(serve_pool(settings, args.serve_pool, args.worker_of), settings.event_loop)
        return 0
    if topology.gateway_processes > 1 and args.worker_of is None:
        from gateway.runtime.workers import run_workers

        # Held (open) until the supervisor returns: its workers join them, nobody else can.
        held = [] if settings.share_port else [hold_port(*p) for p in listened_ports(settings)]
        try:
            return run_workers(settings, args.argv, gateway_process)
        finally:
            for sock in held:
                if sock is not None:
                    sock.close()
    if args.worker_of is None and not settings.share_port:
        # A lone server binds its ports without SO_REUSEPORT, which fails on a served port;
        # checked first, so that the refusal comes before the models load.
        for host, port, what in listened_ports(settings):
            check_port(host, port, what)
    eventloop.run(_serve(settings, args.worker_of), settings.event_loop)
    return 0


def gateway_process(argv: Sequence[str]) -> int:
    """A gateway process of ``serve --workers N``, forked from the supervisor: ``voxgate ARGV``
    (``serve`` and the flags the supervisor gives it)."""
    parser = argparse.ArgumentParser(prog="voxgate")
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.argv = list(argv)
    return cmd_serve(args)


def add_command(sub: Any) -> None:
    """Register ``serve``."""
    serve = command(sub, "serve", cmd_serve, "Run the HTTP gateway.")
    add_setting_flags(serve)
    serve.add_argument("--worker-of", type=int, default=None, help=argparse.SUPPRESS)
    # Run as the host's synthesis pool process of `serve --workers N`, on this Unix socket.
    serve.add_argument("--serve-pool", default=None, help=argparse.SUPPRESS)
