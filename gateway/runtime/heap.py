"""How a gateway process's C heap is set up, so that its RSS stays flat under a long mixed load.

A miss moves its audio through blocks of a few hundred KiB (the worker's reply, the master, the
encoded body). glibc's malloc hands out blocks that large with mmap (given back on free) only
until the first one is freed: then its mmap threshold rises past them (up to 32 MiB) and they
come from its arenas, which keep freed memory for reuse, and every thread that allocates (the
disk and Redis executors too) may open an arena of its own. Blocks of varying size then leave
holes a later block does not fit, and the heap grows while the memory in use does not: in soaks
(``python -m bench.soak``) a gateway's malloc arenas kept growing while the bytes in use stayed
flat, and a periodic ``malloc_trim`` did not stop it. With the threshold fixed at glibc's default
of 128 KiB and two arenas, the free memory malloc holds stays small and the gateway's RSS levels
off (the 30-minute soak's RSS by role: docs/bench/soak.json, ``steady_state``).

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
