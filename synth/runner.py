"""Run engine batches in a thread (the in-process runner)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Sequence

from metrics import Metrics
from synth.engine import Audio, Engine, SynthesisItem
from synth.errors import EngineDead, SynthesisTimeout

log = logging.getLogger("voxgate.synth")

# Abandoned batches still running before the runner stops taking new ones: each holds a thread
# that cannot be killed, so an input that hangs the engine every time must not pile them up.
MAX_ABANDONED = 4


class ThreadRunner:
    """Runs batches on a dedicated thread pool.

    ONNX Runtime and torch release the GIL while they compute, so the event loop stays responsive.
    A pool of ``workers`` threads allows that many batches at once.

    A batch past ``batch_timeout_s`` fails with :class:`SynthesisTimeout`, like one in a worker
    process; a thread cannot be killed, so its batch is abandoned and later batches run on a fresh
    thread pool instead of queueing behind it. While :data:`MAX_ABANDONED` abandoned batches are
    still running, new ones fail at once with :class:`EngineDead` (a worker pool,
    ``synth_workers >= 1``, kills and replaces a stuck worker instead).
    """

    # Counted and timed by the scheduler; a batch on an engine thread finishes once started.
    counts_syntheses = True
    times_batches = False
    cancel_when_abandoned = False
    queues_work = False
    passes_pcm = False  # an engine's batch comes whole

    def __init__(
        self,
        engine: Engine,
        workers: int = 1,
        *,
        batch_timeout_s: float | None = None,
        model: str = "",
        metrics: Metrics | None = None,
    ) -> None:
        self.engine = engine
        self.workers = workers
        self.batch_timeout_s = batch_timeout_s
        self.model = model or engine.name
        self.metrics = metrics
        self._pool = self._new_pool()
        self._abandoned: set[asyncio.Future[list[Audio]]] = set()

    def _new_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="synth")

    async def start(self) -> None:
        """Load and warm the engine (off the loop)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.engine.load)
        await loop.run_in_executor(self._pool, self.engine.warm_up)

    @property
    def abandoned(self) -> int:
        """Batches given up on after the timeout that are still running."""
        return len(self._abandoned)

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        if len(self._abandoned) >= MAX_ABANDONED:
            raise EngineDead(
                f"the in-process engine is stuck in {len(self._abandoned)} batches past the "
                "batch timeout"
            )
        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(self._pool, self.engine.synthesize_batch, list(items))
        if self.batch_timeout_s is None:
            return await running
        try:
            # shield: on a timeout the future stays ours to watch until the thread returns.
            return await asyncio.wait_for(asyncio.shield(running), self.batch_timeout_s)
        except TimeoutError:
            self._abandon(running)
            raise SynthesisTimeout(
                f"synthesis took longer than {self.batch_timeout_s:g}s; the batch was abandoned"
            ) from None

    def _abandon(self, running: asyncio.Future[list[Audio]]) -> None:
        self._abandoned.add(running)
        running.add_done_callback(self._abandoned_done)
        # Later batches get fresh threads; the old pool ends its thread once the batch returns.
        self._pool.shutdown(wait=False)
        self._pool = self._new_pool()
        if self.metrics is not None:
            self.metrics.worker_restarts.labels(self.model, "timeout").inc()
        log.warning(
            "in-process synthesis of model %s ran past %gs: batch abandoned (%d still running)",
            self.model,
            self.batch_timeout_s,
            len(self._abandoned),
        )

    def _abandoned_done(self, running: asyncio.Future[list[Audio]]) -> None:
        self._abandoned.discard(running)
        if not running.cancelled():
            running.exception()  # retrieved: nobody awaits an abandoned batch

    async def close(self) -> None:
        """Stop the threads (waits for a running batch, not for abandoned ones)."""
        await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)
