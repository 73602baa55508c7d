"""ONNX Runtime's arena: kept for ordinary runs, shrunk at the end of a large one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from synth.onnx_memory import KEEP_ARENA_IDS, ShrinkingSession


class Recorder:
    """An ``InferenceSession`` stand-in that records the run options it was given."""

    def __init__(self) -> None:
        self.options: list[Any] = []

    def run(
        self, outputs: Sequence[str] | None, feeds: Mapping[str, Any], options: Any
    ) -> list[int]:
        self.options.append(options)
        return [len(self.options)]

    def get_inputs(self) -> list[str]:
        return ["input", "scales", "speed"]


def feed(ids: int, *, length_scale: float = 1.0, speed: float | None = 1.0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input": np.zeros((1, ids), dtype=np.int64),
        "input_lengths": np.asarray([ids], dtype=np.int64),
        "scales": np.asarray([0.667, length_scale, 0.8], dtype=np.float32),
    }
    if speed is not None:
        out["speed"] = np.asarray([speed], dtype=np.float32)
    return out


def shrinks(session: ShrinkingSession, recorder: Recorder, f: dict[str, Any]) -> bool:
    session.run(None, f)
    return recorder.options[-1] is session.run_options


def test_an_ordinary_sentence_keeps_the_arena_and_a_long_run_shrinks_it() -> None:
    recorder = Recorder()
    session = ShrinkingSession(recorder)
    assert not shrinks(session, recorder, feed(165))  # a 3.8 s IVR sentence
    assert not shrinks(session, recorder, feed(KEEP_ARENA_IDS))
    assert shrinks(session, recorder, feed(KEEP_ARENA_IDS + 1))
    assert shrinks(session, recorder, feed(499))  # a 12 s sentence
    # Every run went through the wrapped session, with the options chosen for it.
    assert len(recorder.options) == 4
    assert recorder.options[0] is session.keep_options


def test_slow_speech_and_a_longer_length_scale_count_as_the_audio_they_make() -> None:
    recorder = Recorder()
    session = ShrinkingSession(recorder)
    assert shrinks(session, recorder, feed(100, speed=0.25))  # 400 ids' worth of frames
    assert not shrinks(session, recorder, feed(400, speed=2.0))
    assert shrinks(session, recorder, feed(200, length_scale=1.5))
    assert not shrinks(session, recorder, feed(200, speed=None))


def test_a_feed_it_cannot_size_always_shrinks() -> None:
    recorder = Recorder()
    session = ShrinkingSession(recorder)
    assert shrinks(session, recorder, {"x": np.zeros((1, 3), dtype=np.float32)})
    assert session.get_inputs() == ["input", "scales", "speed"]  # the rest is the session's
