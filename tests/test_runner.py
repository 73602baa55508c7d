"""The in-process runner gets the batch timeout too: a stuck engine thread is
abandoned, later batches run on fresh threads, and stuck threads never pile up."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from metrics import Metrics
from synth.engine import Audio, SynthesisItem
from synth.errors import EngineDead, SynthesisTimeout
from synth.runner import MAX_ABANDONED, ThreadRunner
from tests.support import ToneEngine, until


class StallingEngine(ToneEngine):
    """A tone engine whose ``stall`` texts block until the test lets them go."""

    def __init__(self) -> None:
        super().__init__()
        self.let_go = threading.Event()

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        if any("stall" in i.text for i in items):
            self.let_go.wait(30)
        return super().synthesize_batch(items)


def timeouts(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value(
        "voxgate_synthesis_worker_restarts_total", {"model": "tone", "reason": "timeout"}
    )
    return value or 0.0


async def test_a_stuck_batch_times_out_and_the_next_one_runs(metrics: Metrics) -> None:
    engine = StallingEngine()
    runner = ThreadRunner(engine, 1, batch_timeout_s=0.3, model="tone", metrics=metrics)
    await runner.start()
    try:
        with pytest.raises(SynthesisTimeout):
            await runner.run_batch([SynthesisItem("stall here", "beep")])
        assert timeouts(metrics) == 1
        assert runner.abandoned == 1
        # One thread, and it is stuck: the next batch still runs, on a fresh one. Its bound is
        # 5 s, not 0.3 s (a fresh thread on a loaded machine): a batch queued behind the stuck
        # thread would still wait out the engine's 30 s and time out.
        runner.batch_timeout_s = 5
        audios = await asyncio.wait_for(runner.run_batch([SynthesisItem("fine", "beep")]), 60)
        assert len(audios) == 1
    finally:
        engine.let_go.set()
        await runner.close()


async def test_abandoned_batches_are_bounded(metrics: Metrics) -> None:
    engine = StallingEngine()
    runner = ThreadRunner(engine, 1, batch_timeout_s=0.2, model="tone", metrics=metrics)
    await runner.start()
    try:
        for _ in range(MAX_ABANDONED):
            with pytest.raises(SynthesisTimeout):
                await runner.run_batch([SynthesisItem("stall", "beep")])
        with pytest.raises(EngineDead, match="stuck"):
            await runner.run_batch([SynthesisItem("fine", "beep")])
        engine.let_go.set()  # the engine comes back: so does the runner
        await until(lambda: runner.abandoned == 0, 60, "the abandoned batches to end")
        runner.batch_timeout_s = 5  # (0.2 s was a fresh thread's start on a loaded machine)
        assert len(await runner.run_batch([SynthesisItem("fine", "beep")])) == 1
    finally:
        engine.let_go.set()
        await runner.close()
