"""Giving memory back after a large synthesis.

ONNX Runtime's CPU arena keeps every block it ever grew to: one long sentence at a slow speed
(a minute of audio) grows a Piper process by as much as the run needed, and it stays there. Two
levers, compared on the joe voice by the CPU time of ordinary sentences and the RSS above the
resting value after such a run:

- arena kept (ONNX Runtime's default): the least CPU, and the whole peak kept;
- arena off (``enable_cpu_mem_arena = False``): more CPU, and glibc still keeps much of the
  freed heap unless ``malloc_trim`` gives it back;
- arena kept, shrunk after each run (run option ``memory.enable_memory_arena_shrinkage``) plus
  ``malloc_trim``: about as much CPU as the arena off, and memory back near its resting value.

voxgate shrinks the arena after every run and trims the C heap after a run that made long audio:
a little more CPU per sentence, and a worker's memory is back near its resting value once a
large request is done (``python -m bench.soak`` records the RSS around two long requests in
docs/bench/soak.json).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping, Sequence
from typing import Any

# A run that made more audio than this (seconds) is followed by malloc_trim: the call walks the
# heap (about a millisecond), so ordinary sentences skip it.
TRIM_AFTER_AUDIO_S = 10.0


def shrinking_run_options() -> Any:
    """``onnxruntime.RunOptions`` that return the CPU arena's free blocks at the end of a run."""
    import onnxruntime

    options = onnxruntime.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


class ShrinkingSession:
    """An ``InferenceSession`` whose ``run`` shrinks the CPU arena afterwards.

    For callers that call ``session.run(outputs, feeds)`` themselves (Piper's ``PiperVoice``) and
    so cannot be handed run options.
    """

    def __init__(self, session: Any) -> None:
        self.session = session
        self.run_options = shrinking_run_options()

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> Any:
        return self.session.run(output_names, input_feed, self.run_options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


@functools.cache
def _libc_trim() -> Any:
    # The process's own symbols (dlopen(NULL)): the C library's, without find_library's ldconfig
    # subprocess, which would block an event loop that asks.
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)  # glibc only


def release_freed_memory() -> bool:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``); False elsewhere."""
    trim = _libc_trim()
    if trim is None:
        return False
    trim(0)
    return True
