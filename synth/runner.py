"""Run engine batches in a thread (the in-process runner)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence

from synth.engine import Audio, Engine, SynthesisItem


class ThreadRunner:
    """Runs batches on a dedicated thread pool.

    ONNX Runtime and torch release the GIL while they compute, so the event loop stays responsive.
    A pool of ``workers`` threads allows that many batches at once.
    """

    def __init__(self, engine: Engine, workers: int = 1) -> None:
        self.engine = engine
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="synth")

    async def start(self) -> None:
        """Load and warm the engine (off the loop)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.engine.load)
        await loop.run_in_executor(self._pool, self.engine.warm_up)

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.engine.synthesize_batch, list(items))

    async def close(self) -> None:
        """Stop the threads (waits for a running batch)."""
        await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)
