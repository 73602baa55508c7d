"""The upstreams file (``upstreams_file``): remote TTS providers served as models.

Read at start, by the gateway processes and by the host's pool process alike; an entry that is
wrong stops the start with one line naming the file, the entry and the field (exit 2). SIGHUP
reads it again and applies what can change under load (:func:`reload_upstreams`). What an
entry holds and what each kind does: docs/upstreams.md; the clients: :mod:`synth.upstream`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence

from gateway.runtime.settings import Settings
from gateway.speech.masters import ModelHandle
from synth.upstream import (
    UpstreamConfig,
    UpstreamEngine,
    UpstreamRunner,
    check_config,
    load_upstreams,
    missing_sdk,
)

log = logging.getLogger("voxgate.upstream")


def upstream_configs(settings: Settings, local: Sequence[str] = ()) -> dict[str, UpstreamConfig]:
    """The upstreams file's entries by name (none without ``upstreams_file``); blocking (reads
    the file). ``ValueError`` naming what is wrong, also for a name a local model has, or an
    API key variable that is not set."""
    if not settings.upstreams_file:
        return {}
    configs = load_upstreams(settings.upstreams_file)
    for config in configs:
        if config.name in local:
            raise ValueError(
                f"upstreams file {settings.upstreams_file}: {config.name!r} is already the name "
                "of a local model"
            )
        check_config(config, os.environ)
        missing = missing_sdk(config)
        if missing:
            raise ValueError(
                f"upstream {config.name!r} (kind {config.kind}) needs the {missing} package: "
                f"pip install 'voxgate[{config.kind}]'"
            )
    return {c.name: c for c in configs}


async def reload_upstreams(settings: Settings, handles: Mapping[str, ModelHandle]) -> bool:
    """Read the upstreams file again (on SIGHUP) and give each served upstream what can change
    under load; the rest takes a restart (docs/upstreams.md, "Configure"). False, logged, and
    nothing changed when the file no longer loads."""
    if not settings.upstreams_file:
        return True
    local = [name for name, h in handles.items() if not isinstance(h.engine, UpstreamEngine)]
    try:
        configs = await asyncio.to_thread(upstream_configs, settings, local)
    except ValueError as exc:
        log.error("upstreams not reloaded, the previous entries stay in use: %s", exc)
        return False
    served = {name for name, h in handles.items() if isinstance(h.engine, UpstreamEngine)}
    for name in sorted(served):
        handle = handles[name]
        config = configs.get(name)
        if config is None:
            log.warning(
                "upstream %s is no longer in the file: served as it was until a restart", name
            )
            continue
        runner = handle.scheduler.runner
        # Where the calls are made (this process, or the host's pool process, which reloads
        # too), the runner; elsewhere only what this process reads (the price).
        target = runner if isinstance(runner, UpstreamRunner) else handle.engine
        assert isinstance(target, UpstreamRunner | UpstreamEngine)
        reason = target.reconfigure(config)
        if reason:
            log.warning("upstream %s: %s takes a restart; served as it was", name, reason)
    for name in sorted(set(configs) - served):
        log.warning("upstream %s is new in the file: served after a restart", name)
    log.info("upstreams reloaded from %s", settings.upstreams_file)
    return True
