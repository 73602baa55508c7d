"""The host's one synthesis pool process of ``serve --workers N``.

The supervisor starts it before the gateway processes (``python -m gateway serve ... --serve-pool
PATH``): it opens the models exactly as a single gateway would (worker processes per model, one
scheduler each, so crash and hang handling are :mod:`synth.pool`'s), and only once every engine is
warm listens on the Unix socket ``PATH``, where each gateway process's
:class:`synth.shared_pool.RemotePool` connects; what it does for them: docs/deploy.md ("Several
processes on one host") and :class:`synth.shared_pool.PoolServer`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from gateway.runtime.components import open_models
from gateway.runtime.settings import Settings
from gateway.runtime.upstreams import reload_upstreams
from metrics import Metrics
from synth.shared_pool import PoolServer

log = logging.getLogger("voxgate.pool")


async def serve_pool(settings: Settings, path: str, parent_pid: int | None) -> None:
    """Run the pool until SIGTERM/SIGINT or until the supervisor is gone."""
    from gateway.runtime.workers import watch_parent

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    orphan_watch = (
        asyncio.ensure_future(watch_parent(parent_pid, stop)) if parent_pid is not None else None
    )
    metrics = Metrics()
    async with open_models(settings, metrics, wait_ready=True) as handles:
        server = PoolServer({name: h.scheduler for name, h in handles.items()})
        # SIGHUP (the supervisor passes its own on): the upstreams' tunables, for the calls
        # this process makes for every gateway process of the host.
        reloads: set[asyncio.Task[bool]] = set()

        def reload() -> None:
            task = asyncio.ensure_future(reload_upstreams(settings, handles))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, reload)
        # A socket file left by a pool process that was killed would make the bind fail.
        await asyncio.to_thread(Path(path).unlink, missing_ok=True)
        listener = await asyncio.start_unix_server(server.handle, path)
        os.chmod(path, 0o600)  # only this user's gateway processes submit work
        log.info(
            "synthesis pool ready on %s: %s",
            path,
            ", ".join(
                # A pool's size; 1 for an engine run in this process.
                f"{name} ({getattr(h.scheduler.runner, 'size', 1)} workers)"
                for name, h in handles.items()
            ),
        )
        try:
            await stop.wait()
        finally:
            listener.close()
            await server.close()
            await listener.wait_closed()
            await asyncio.to_thread(Path(path).unlink, missing_ok=True)
    if orphan_watch is not None:
        orphan_watch.cancel()
    log.info("synthesis pool stopped")
