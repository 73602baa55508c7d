"""Giving memory back after a large synthesis: ONNX Runtime's CPU arena keeps every block it
ever grew to. The levers compared, the bound between keeping and shrinking it, and what each cost:
docs/synthesis.md, "Memory per run". A worker's memory is back near the bound's peak once a large
request is done (``python -m bench.soak`` records the RSS around two long requests in
docs/bench/soak.json).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from synth.seeded_noise import feed_stretch

# A run that made more audio than this (seconds) is followed by malloc_trim: the call walks the
# heap (about a millisecond), so ordinary sentences skip it.
TRIM_AFTER_AUDIO_S = 10.0
# A run of more input ids than this (times the length scale, over the speed) shrinks the arena
# at its end; smaller runs keep it. The bundled voice makes about 43 ids a second of audio
# (a 3.8 s sentence is 165 ids), so this is about 6 s of speech.
KEEP_ARENA_IDS = 256


class ShrinkingSession:
    """An ``InferenceSession`` whose ``run`` shrinks the CPU arena after a large run.

    For callers that call ``session.run(outputs, feeds)`` themselves (Piper's ``PiperVoice``) and
    so cannot be handed run options. The size of a run is read from the VITS graph's own inputs:
    ``input`` (the ids), ``scales`` (its second value the length scale) and ``speed`` (the
    rewritten graph's, :mod:`synth.exact_speed`); a feed without ``input`` always shrinks.
    """

    def __init__(self, session: Any, keep_ids: int = KEEP_ARENA_IDS) -> None:
        import onnxruntime

        self.session = session
        self.keep_ids = keep_ids
        self.run_options = onnxruntime.RunOptions()
        self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self.keep_options = onnxruntime.RunOptions()

    def options_for(self, input_feed: Mapping[str, Any]) -> Any:
        """The run options for this feed: shrinking ones for a run larger than ``keep_ids``."""
        if "input" not in input_feed or feed_stretch(input_feed) > self.keep_ids:
            return self.run_options
        return self.keep_options

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> Any:
        return self.session.run(output_names, input_feed, self.options_for(input_feed))

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


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``; elsewhere nothing)."""
    trim = _libc_trim()
    if trim is not None:
        trim(0)
