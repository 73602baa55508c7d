"""Which voxgate is running: the version for ``voxgate_build_info`` and the CLI."""

from __future__ import annotations

import platform
from importlib import metadata

from metrics import Metrics


def version() -> str:
    """The installed voxgate version, or ``unknown`` when run from a source tree."""
    try:
        return metadata.version("voxgate")
    except metadata.PackageNotFoundError:
        return "unknown"


def record_build_info(metrics: Metrics) -> None:
    """Set ``voxgate_build_info`` (1, labelled with the versions running)."""
    metrics.build_info.labels(version(), platform.python_version()).set(1)
