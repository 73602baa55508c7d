"""Worker processes that each hold one warmed engine: the out-of-process :class:`BatchRunner`.

Why processes: an engine crash (a segfault in a native runtime, an OOM kill) or a hang takes down
one worker, never the gateway, and N processes x 1 intra-op thread measured faster than one process
x N threads for Piper on 2 cores (4.33 vs 3.92 syntheses/s).

Each worker is a ``spawn``ed interpreter (no forked torch/ONNX Runtime state) that builds its engine
from a picklable :class:`EngineSpec`, loads and warms it, then reports ready. A batch goes to an idle
worker over a pipe. A worker that dies mid-batch is replaced and the batch retried once on another
worker; a second death fails the batch with :class:`EngineDead` (HTTP 503). A batch running past
``batch_timeout_s`` gets its worker killed and replaced and fails with :class:`SynthesisTimeout`
(not retried: a hanging input would hang the next worker too).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metrics import Metrics
from synth.cancellation import cancel_and_wait
from synth.engine import Audio, Engine, SynthesisItem
from synth.errors import (
    EngineDead,
    EngineError,
    SynthesisError,
    SynthesisTimeout,
    UnspeakableInput,
)

log = logging.getLogger("voxgate.synth.pool")

_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class EngineSpec:
    """How to build an engine in another process: an importable factory and its arguments.

    ``factory`` is ``"package.module:Name"`` (or ``"package.module.Name"``); ``kwargs`` must pickle.
    """

    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def build(self, **overrides: Any) -> Engine:
        """Construct the engine (not loaded)."""
        module_name, sep, attr = self.factory.partition(":")
        if not sep:
            module_name, _, attr = self.factory.rpartition(".")
        factory = getattr(importlib.import_module(module_name), attr)
        engine: Engine = factory(**{**self.kwargs, **overrides})
        return engine


def _worker_main(
    spec: EngineSpec, threads: int, conn: multiprocessing.connection.Connection
) -> None:
    """Entry point of a worker process: build, load, warm, then serve batches until EOF."""
    # Before torch / ONNX Runtime load: their thread pools read these once.
    for name in _THREAD_ENV:
        os.environ[name] = str(threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        engine = spec.build()
        engine.load()
        engine.warm_up()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise
    conn.send(("ready", os.getpid()))
    while True:
        try:
            items = conn.recv()
        except (EOFError, OSError):
            return  # the gateway closed the pipe: shut down
        try:
            outputs = engine.synthesize_batch(items)
            reply: tuple[Any, ...] = ("ok", [(a.pcm, a.sample_rate) for a in outputs])
        except SynthesisError as exc:
            reply = ("error", type(exc).__name__, str(exc))
        except Exception as exc:  # an engine bug fails this batch, not the worker
            logging.getLogger("voxgate.synth.worker").exception("batch failed")
            reply = ("error", "EngineError", f"synthesis failed: {type(exc).__name__}")
        conn.send(reply)


class WorkerDied(Exception):
    """The worker process ended while it held a batch (internal: triggers the retry)."""


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, index: int, spec: EngineSpec, threads: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.index = index
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main,
            args=(spec, threads, child),
            name=f"synth-worker-{index}",
            daemon=True,
        )
        self.process.start()
        child.close()  # only the child holds its end: its death then reads as EOF here

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the worker reports ready; raise if it fails or dies first."""
        if not self.conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"synthesis worker {self.index} not ready in {timeout_s:.0f}s")
        try:
            message = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerDied(f"synthesis worker {self.index} died while loading") from exc
        if message[0] != "ready":
            self.kill()
            raise EngineError(f"synthesis worker {self.index} failed to load: {message[1]}")

    def call(self, items: Sequence[SynthesisItem], timeout_s: float) -> list[Audio]:
        """Run one batch (blocking). ``WorkerDied`` on death, ``TimeoutError`` past the bound."""
        try:
            self.conn.send(list(items))
            answered = self.conn.poll(timeout_s)
            reply = self.conn.recv() if answered else None
        except (EOFError, OSError) as exc:
            raise WorkerDied(f"synthesis worker {self.index} died") from exc
        if reply is None:
            # Raised outside the try: TimeoutError is an OSError and must not read as a death.
            raise TimeoutError(f"synthesis worker {self.index} timed out")
        if reply[0] == "ok":
            return [Audio(pcm, rate) for pcm, rate in reply[1]]
        kind, message = reply[1], reply[2]
        error = {
            "EngineDead": EngineDead,
            "SynthesisTimeout": SynthesisTimeout,
            "UnspeakableInput": UnspeakableInput,
        }.get(kind, EngineError)
        raise error(message)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the pipe (the worker exits on EOF); kill it if it does not."""
        self.conn.close()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


def _kill_when_started(future: asyncio.Future[_Worker]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().process.kill()  # a signal only: never blocks the loop


class WorkerPool:
    """A :class:`~synth.scheduler.BatchRunner` over ``len(specs)`` worker processes.

    ``specs[i]`` builds worker ``i``'s engine (one per GPU when ``devices`` differ); ``engine`` is an
    unloaded instance in this process for metadata (voices, fingerprint, sample rate).
    ``threads`` is each worker's intra-op thread count: workers x threads should fit the cores.
    """

    def __init__(
        self,
        model: str,
        engine: Engine,
        specs: Sequence[EngineSpec],
        metrics: Metrics,
        *,
        threads: int = 1,
        batch_timeout_s: float = 60.0,
        start_timeout_s: float = 600.0,
    ) -> None:
        if not specs:
            raise ValueError("a worker pool needs at least one engine spec")
        self.model = model
        self.engine = engine
        self.specs = list(specs)
        self.metrics = metrics
        self.threads = threads
        self.batch_timeout_s = batch_timeout_s
        self.start_timeout_s = start_timeout_s
        self._workers: dict[int, _Worker] = {}
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._replacing: set[asyncio.Task[None]] = set()
        # Blocking pipe reads and process joins run here, never on the event loop: one thread per
        # worker in flight plus one per worker (re)starting.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            2 * len(self.specs) + 2, thread_name_prefix=f"pool-{model}"
        )
        self._closed = False

    @property
    def size(self) -> int:
        """Workers the pool keeps."""
        return len(self.specs)

    @property
    def ready_workers(self) -> int:
        """Workers alive and serving (idle or busy), excluding ones being replaced."""
        return sum(1 for w in self._workers.values() if w.process.is_alive())

    def worker_pids(self) -> list[int]:
        """PIDs of the live workers (for operators and tests)."""
        return [w.pid for w in self._workers.values() if w.pid is not None and w.process.is_alive()]

    async def _spawn(self, index: int) -> _Worker:
        loop = asyncio.get_running_loop()
        starting = loop.run_in_executor(
            self._threads, _Worker, index, self.specs[index], self.threads
        )
        try:
            worker = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Shut down while the process was being created: kill it once it exists, or it
            # would outlive the pool.
            starting.add_done_callback(_kill_when_started)
            raise
        try:
            await loop.run_in_executor(self._threads, worker.wait_ready, self.start_timeout_s)
        except BaseException:
            await loop.run_in_executor(self._threads, worker.kill)
            raise
        return worker

    async def start(self) -> None:
        """Start every worker and wait until all are loaded and warm."""
        started = time.perf_counter()
        workers = await asyncio.gather(
            *(self._spawn(i) for i in range(self.size)), return_exceptions=True
        )
        failures = [w for w in workers if isinstance(w, BaseException)]
        for w in workers:
            if isinstance(w, _Worker):
                self._workers[w.index] = w
                self._idle.put_nowait(w)
        if failures:
            await self.close()
            raise failures[0]
        log.info(
            "worker pool ready: model=%s workers=%d threads=%d in %.1fs",
            self.model,
            self.size,
            self.threads,
            time.perf_counter() - started,
        )

    def _replace(self, worker: _Worker, reason: str) -> None:
        """Kill ``worker`` and start its successor in the background."""
        if self._workers.get(worker.index) is worker:
            del self._workers[worker.index]
        self.metrics.worker_restarts.labels(self.model, reason).inc()
        log.warning(
            "synthesis worker %d (pid %s) %s; replacing it", worker.index, worker.pid, reason
        )
        task = asyncio.create_task(self._respawn(worker), name=f"respawn-{self.model}")
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _respawn(self, old: _Worker) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, old.kill)
        delay = 0.5
        while not self._closed:
            try:
                worker = await self._spawn(old.index)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replacement for synthesis worker %d failed; retrying", old.index)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._closed:
                await loop.run_in_executor(self._threads, worker.stop)
                return
            self._workers[old.index] = worker
            self._idle.put_nowait(worker)
            log.info("synthesis worker %d replaced (pid %s)", old.index, worker.pid)
            return

    async def _acquire(self) -> _Worker:
        """An idle live worker; a dead one found idle is replaced and skipped."""
        deadline = time.monotonic() + self.batch_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineDead("no synthesis worker became available")
            try:
                worker = await asyncio.wait_for(self._idle.get(), remaining)
            except TimeoutError:
                raise EngineDead("no synthesis worker became available") from None
            if worker.process.is_alive():
                return worker
            self._replace(worker, "died")

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        """Run ``items`` on an idle worker; retry once on another if the worker dies."""
        if self._closed:
            raise EngineDead("the synthesis pool is shut down")
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            worker = await self._acquire()
            healthy = False
            try:
                result = await loop.run_in_executor(
                    self._threads, worker.call, list(items), self.batch_timeout_s
                )
                healthy = True
                return result
            except WorkerDied:
                self._replace(worker, "died")
                if attempt == 2:
                    raise EngineDead("the synthesis worker died twice running this batch") from None
                log.warning("retrying a batch of %d after a worker died", len(items))
            except TimeoutError:
                self._replace(worker, "timeout")
                raise SynthesisTimeout(
                    f"synthesis took longer than {self.batch_timeout_s:g}s; the worker was replaced"
                ) from None
            except SynthesisError:
                healthy = True  # the engine refused this input; the worker is fine
                raise
            except asyncio.CancelledError:
                # The pipe may still carry this batch's reply: the worker cannot be reused.
                self._replace(worker, "cancelled")
                raise
            finally:
                if healthy:
                    self._idle.put_nowait(worker)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Stop every worker (and any replacement in progress)."""
        self._closed = True
        await cancel_and_wait(*self._replacing)
        loop = asyncio.get_running_loop()
        workers = list(self._workers.values())
        self._workers.clear()
        await asyncio.gather(*(loop.run_in_executor(self._threads, w.stop) for w in workers))
        await asyncio.to_thread(self._threads.shutdown, wait=True, cancel_futures=True)
