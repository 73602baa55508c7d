"""The micro-batching scheduler, in process, with a scripted runner."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from metrics import Metrics
from synth.engine import Audio, SynthesisItem
from synth.errors import UnspeakableInput
from synth.scheduler import Scheduler
from tests.support import ThreadRunnerFlags


class ScriptedRunner(ThreadRunnerFlags):
    """Fails any batch holding a text of only punctuation, as a real voice does."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        self.batches.append([i.text for i in items])
        await asyncio.sleep(0)
        if any(not any(c.isalnum() for c in i.text) for i in items):
            raise UnspeakableInput("the voice produced no audio for this input")
        return [Audio(np.zeros(len(i.text), dtype=np.float32), 16000) for i in items]


async def test_one_unspeakable_item_fails_alone_not_its_whole_batch() -> None:
    runner = ScriptedRunner()
    sched = Scheduler("m", runner, Metrics(), max_batch=4, max_wait_ms=50)
    sched.start()
    try:
        texts = ["Hello there.", "?!", "Good morning.", "Bye."]
        results = await asyncio.gather(
            *(sched.submit(SynthesisItem(t, "v")) for t in texts), return_exceptions=True
        )
    finally:
        await sched.close()
    assert len(runner.batches[0]) == 4  # they were batched together first
    assert isinstance(results[1], UnspeakableInput)
    for text, result in zip(texts, results, strict=True):
        if text != "?!":
            assert isinstance(result, Audio) and len(result.pcm) == len(text)


@pytest.mark.parametrize("n", [1, 3])
async def test_a_batch_of_n_gives_n_results_in_order(n: int) -> None:
    runner = ScriptedRunner()
    sched = Scheduler("m", runner, Metrics(), max_batch=n, max_wait_ms=50)
    sched.start()
    try:
        texts = [f"text number {'x' * i}" for i in range(n)]
        results = await asyncio.gather(*(sched.submit(SynthesisItem(t, "v")) for t in texts))
    finally:
        await sched.close()
    assert [len(r.pcm) for r in results] == [len(t) for t in texts]
