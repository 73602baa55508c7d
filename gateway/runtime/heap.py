"""How a gateway process's C heap is set up, so that its RSS stays flat under a long mixed load.

A miss's audio blocks (the worker's reply, the master, the encoded body: a few hundred KiB) made
glibc raise its mmap threshold (up to 32 MiB) and serve them from arenas, one per allocating
thread (the disk and Redis executors too), which fragmented: why the threshold is fixed at
glibc's default of 128 KiB with two arenas, as measured: docs/performance.md, "Soak: long-running
stability" (RSS by role: docs/bench/soak.json, ``steady_state``).

The settings are glibc's own (``mallopt``), applied when a gateway or pool-host process starts,
before its threads; an operator's ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_ARENA_MAX`` in the
environment wins. Synthesis workers are left alone: their engines manage their own memory
(synth/onnx_memory.py). Elsewhere than glibc this is a no-op.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

log = logging.getLogger("voxgate.heap")

# mallopt parameters (glibc's malloc.h).
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

# glibc's default threshold, made fixed: setting it turns its upward adjustment off.
MMAP_THRESHOLD_BYTES = 128 * 1024
# The event loop's thread and one for the executors' allocations.
ARENAS = 2

_ENV = {M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_", M_ARENA_MAX: "MALLOC_ARENA_MAX"}


def tune_malloc(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """Fix the mmap threshold and bound the arenas (each unless the environment sets it); the
    values set, by glibc's environment name (empty where there is no glibc ``mallopt``)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: no library lookup
    except (OSError, AttributeError):
        return {}
    applied: dict[str, int] = {}
    for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_ARENA_MAX, ARENAS)):
        name = _ENV[param]
        if name in environ:
            continue  # the operator's choice, already read by glibc at start
        if mallopt(param, value) == 1:
            applied[name] = value
        else:
            log.warning("mallopt refused %s=%d", name, value)
    return applied
