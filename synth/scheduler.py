"""The micro-batching scheduler: a bounded queue in the gateway process in front of a runner.

Its contract (after Ray Serve's ``@serve.batch``) and each client's share of the queue:
docs/synthesis.md, "Micro-batching scheduler" (and, for a runner that ``queues_work``, the top of
that page). The shares are counted in a :class:`ClientShares`: this process's by default; the
gateway gives one that every gateway process of the host shares, so a client's share is the
host's, not one per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from metrics import Metrics
from synth.cancellation import cancel_and_wait
from synth.engine import Audio, SynthesisItem
from synth.errors import (
    ClientQueueFull,
    EngineError,
    Overloaded,
    SynthesisError,
    UnspeakableInput,
)

log = logging.getLogger("voxgate.synth")


class ClientShares(Protocol):
    """Where items waiting per client are counted."""

    def take(self, client: str, limit: int) -> bool:
        """Count one more item waiting for ``client`` if fewer than ``limit`` wait (True)."""

    def give(self, client: str) -> None:
        """One item of ``client`` counted by :meth:`take` no longer waits."""

    def waiting_for(self, client: str) -> int:
        """Items waiting for ``client``."""


class LocalShares:
    """:class:`ClientShares` of this process alone."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def take(self, client: str, limit: int) -> bool:
        if self._counts[client] >= limit:
            return False
        self._counts[client] += 1
        return True

    def give(self, client: str) -> None:
        self._counts[client] -= 1
        if self._counts[client] <= 0:
            del self._counts[client]

    def waiting_for(self, client: str) -> int:
        return self._counts[client]


class BatchRunner(Protocol):
    """Runs one batch somewhere other than the event loop (a thread, a worker process).

    What the scheduler must know of it: ``counts_syntheses`` (False: it runs in another process
    that counts its own syntheses, :mod:`synth.shared_pool`; counted here too, the host's figures
    would double), ``times_batches`` (True: it pipelines batches and times each from when it
    runs, :mod:`synth.pool`) and ``cancel_when_abandoned`` (True: a call nobody waits for any
    more may be cancelled, and the runner drops the work; others must finish a batch: a
    worker's pipe or an engine thread cannot be left half-way). ``passes_pcm`` (True: it hands
    each piece of an item's raw 16-bit pcm, at the engine's rate, to the item's ``sink`` as it
    arrives, before the whole: an upstream that streams, or the host's pool process running one)
    is read by the speech path, not by the scheduler. ``queues_work`` (True: it queues what it is
    given itself, in order of arrival: the host's pool process, one queue for every gateway
    process, or an upstream's slots) makes an item count in its client's share until its call
    ends, not only until it is handed over (give such a runner a concurrency that hands it every
    item at once: the order is then the runner's one queue's, not this process's turn).
    """

    counts_syntheses: bool
    times_batches: bool
    cancel_when_abandoned: bool
    queues_work: bool

    @property
    def passes_pcm(self) -> bool: ...

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]: ...


class BatchClock:
    """The engine-side figures of one batch: the busy-workers gauge while it runs, and its time
    when it succeeded. A worker pool tells them from the thread that reads a batch's reply (the
    scheduler's own clock would count the time a pipelined batch waits in the pipe behind
    another); the scheduler, for a runner that leaves them to it."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.metrics = metrics
        self.model = model
        self.started = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        self.metrics.busy_workers.labels(self.model).inc()

    def end(self, ok: bool) -> None:
        m = self.metrics
        m.busy_workers.labels(self.model).dec()
        if ok:
            elapsed = time.perf_counter() - self.started
            m.synthesis_seconds.labels(self.model).observe(elapsed)
            m.synthesis_busy_seconds.labels(self.model).inc(elapsed)


@dataclass
class _Pending:
    item: SynthesisItem
    future: asyncio.Future[Audio]
    client: str = ""
    enqueued: float = field(default_factory=time.perf_counter)
    waiting: bool = True  # counted in its client's share


class Scheduler:
    """Queue + batcher for one model.

    ``max_queue`` bounds the items waiting (not running): a submit beyond it raises
    :class:`synth.errors.Overloaded` at once. ``concurrency`` batches run at the same time (one per
    worker). Items are grouped by :meth:`SynthesisItem.batch_group` for up to ``max_wait_ms`` or
    ``max_batch`` items, and sorted by text length inside a batch.
    """

    def __init__(
        self,
        model: str,
        runner: BatchRunner,
        metrics: Metrics,
        *,
        max_queue: int = 64,
        max_batch: int = 1,
        max_wait_ms: float = 0.0,
        concurrency: int = 1,
        retry_after_s: float = 1.0,
        max_per_client: int | None = None,
        shares: ClientShares | None = None,
    ) -> None:
        if max_queue < 1 or max_batch < 1 or concurrency < 1:
            raise ValueError("max_queue, max_batch and concurrency must be >= 1")
        if max_per_client is not None and max_per_client < 1:
            raise ValueError("max_per_client must be >= 1")
        self.max_per_client = max_per_client
        self.shares: ClientShares = shares if shares is not None else LocalShares()
        self.model = model
        self.runner = runner
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.concurrency = concurrency
        self.retry_after_s = retry_after_s
        self._queue: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def depth(self) -> int:
        """Items waiting (not yet in a running batch)."""
        return len(self._queue)

    def start(self) -> None:
        """Start the batch loops (one per unit of concurrency)."""
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._loop(), name=f"scheduler-{self.model}-{i}")
                for i in range(self.concurrency)
            ]

    async def close(self) -> None:
        """Stop the loops and fail whatever is still queued."""
        self._closed = True
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        while self._queue:
            p = self._queue.popleft()
            self._dequeued(p)
            if not p.future.done():
                p.future.set_exception(Overloaded("server is shutting down", self.retry_after_s))
        self._set_depth()

    def waiting_for(self, client: str) -> int:
        """Items ``client`` has waiting (not yet in a running batch)."""
        return self.shares.waiting_for(client)

    def _dequeued(self, p: _Pending) -> None:
        if not p.waiting:
            return
        p.waiting = False
        if p.client:
            self.shares.give(p.client)

    def _handed_over(self, p: _Pending) -> None:
        """``p`` is taken into a batch: it waits no more, unless the runner queues it (then its
        future's end frees its share, see :meth:`submit`)."""
        if not self.runner.queues_work or not p.client:
            self._dequeued(p)

    def _set_depth(self) -> None:
        self.metrics.queue_depth.labels(self.model).set(len(self._queue))

    async def submit(self, item: SynthesisItem, client: str = "") -> Audio:
        """Queue ``item`` for ``client`` and wait for its audio. Raises ``Overloaded`` when the
        queue is full, :class:`ClientQueueFull` when ``client`` has its share waiting ("": no
        client, the CLI or a catalogue warm-up, bound by the queue only)."""
        if self._closed:
            raise Overloaded("server is shutting down", self.retry_after_s)
        if len(self._queue) >= self.max_queue:
            self.metrics.rejected.labels(self.model).inc()
            raise Overloaded(
                f"synthesis queue for model {self.model!r} is full ({self.max_queue} waiting)",
                self.retry_after_s,
            )
        limit = self.max_per_client if self.max_per_client is not None else sys.maxsize
        if client and not self.shares.take(client, limit):
            self.metrics.client_rejected.labels(self.model).inc()
            raise ClientQueueFull(
                f"this client already has {self.max_per_client} syntheses waiting for model "
                f"{self.model!r} (queue_per_client); retry when they are done",
                self.retry_after_s,
            )
        future: asyncio.Future[Audio] = asyncio.get_running_loop().create_future()
        pending = _Pending(item, future, client)
        if client:
            # A waiter that gives up frees its share at once, not when the loop gets to it.
            future.add_done_callback(lambda _: self._dequeued(pending))
        self._queue.append(pending)
        self._set_depth()
        self._wakeup.set()
        return await future

    async def _next_batch(self) -> list[_Pending]:
        while True:
            while not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            first = self._queue.popleft()
            self._handed_over(first)
            if first.future.cancelled():
                continue
            batch = [first]
            group = first.item.batch_group()
            deadline = time.perf_counter() + self.max_wait_s
            while len(batch) < self.max_batch:
                batch.extend(self._take_compatible(group, self.max_batch - len(batch)))
                remaining = deadline - time.perf_counter()
                if len(batch) >= self.max_batch or remaining <= 0:
                    break
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
            self._set_depth()
            return batch

    def _take_compatible(self, group: tuple[object, ...], limit: int) -> list[_Pending]:
        taken: list[_Pending] = []
        keep: deque[_Pending] = deque()
        while self._queue and len(taken) < limit:
            p = self._queue.popleft()
            if p.future.cancelled():
                self._dequeued(p)
                continue
            if p.item.batch_group() == group:
                self._handed_over(p)
                taken.append(p)
            else:
                keep.append(p)
        keep.extend(self._queue)
        self._queue = keep
        return taken

    async def _loop(self) -> None:
        while True:
            batch = await self._next_batch()
            await self._run(batch)

    async def _run(self, batch: list[_Pending]) -> None:
        # Drop items whose waiters are gone before spending engine time on them.
        batch = [p for p in batch if not p.future.cancelled()]
        if not batch:
            return
        batch.sort(key=lambda p: len(p.item.text))
        runner = self.runner
        counts = runner.counts_syntheses
        if counts:
            # Where the batch starts; a runner that counts nothing here (the host's pool
            # process) observes its own waits, and this process's hand-over is not one.
            self._observe_wait(batch)
        timed = counts and not runner.times_batches
        clock = BatchClock(self.metrics, self.model) if timed else None
        if clock is not None:
            clock.start()
        ok = False
        call = asyncio.ensure_future(runner.run_batch([p.item for p in batch]))
        if runner.cancel_when_abandoned:
            _cancel_when_abandoned(call, batch)
        try:
            outputs = await call
            if len(outputs) != len(batch):
                raise EngineError(
                    f"engine returned {len(outputs)} outputs for a batch of {len(batch)}"
                )
            ok = True
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if call.cancelled() and (me is None or not me.cancelling()):
                return  # abandoned by every waiter, not a shutdown of this loop
            _fail(batch, Overloaded("server is shutting down"))
            raise
        except SynthesisError as exc:
            if not isinstance(exc, UnspeakableInput) or len(batch) == 1:
                self._failed(batch, exc, counts)
                return
            # One item with nothing to speak must not fail the others batched with it: run
            # each alone, so only that one gets its 400.
            outputs = None
        except Exception as exc:  # an engine bug must fail its futures, never hang them
            log.exception("synthesis batch failed model=%s size=%d", self.model, len(batch))
            self._failed(batch, EngineError(f"synthesis failed: {type(exc).__name__}"), counts)
            return
        finally:
            if clock is not None:
                clock.end(ok)
        if outputs is None:
            for p in batch:
                await self._run([p])
            return
        self._succeeded(batch, outputs, counts)

    def _observe_wait(self, batch: list[_Pending]) -> None:
        now = time.perf_counter()
        m = self.metrics
        for p in batch:
            m.queue_wait_seconds.labels(self.model).observe(now - p.enqueued)
        m.batch_size.labels(self.model).observe(len(batch))

    def _failed(self, batch: list[_Pending], exc: Exception, counts: bool) -> None:
        if counts:
            self.metrics.syntheses.labels(self.model, "error").inc(len(batch))
        _fail(batch, exc)

    def _succeeded(self, batch: list[_Pending], outputs: list[Audio], counts: bool) -> None:
        m = self.metrics
        if counts:
            m.syntheses.labels(self.model, "ok").inc(len(batch))
        for p, audio in zip(batch, outputs, strict=True):
            if counts:
                m.audio_seconds.labels(self.model).inc(audio.duration_s)
            if not p.future.done():
                p.future.set_result(audio)


def _fail(batch: list[_Pending], exc: BaseException) -> None:
    for p in batch:
        if not p.future.done():
            p.future.set_exception(exc)


def _cancel_when_abandoned(call: asyncio.Future[list[Audio]], batch: list[_Pending]) -> None:
    """Cancel ``call`` once every waiter of ``batch`` is gone, so a runner that can (the host's
    shared pool, an upstream) drops the work nobody waits for."""

    def abandoned(_: object) -> None:
        if not call.done() and all(p.future.cancelled() for p in batch):
            call.cancel()

    for p in batch:
        p.future.add_done_callback(abandoned)
