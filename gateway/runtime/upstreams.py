"""The upstreams file (``upstreams_file``): remote TTS providers served as models.

Read at start, by the gateway processes and by the host's pool process alike; an entry that is
wrong stops the start with one line naming the file, the entry and the field (exit 2). What an
entry holds and what each kind does: docs/upstreams.md; the clients: :mod:`synth.upstream`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from gateway.runtime.settings import Settings
from synth.upstream import UpstreamConfig, check_config, load_upstreams, missing_sdk


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
