"""Worker processes that each hold one warmed engine: the out-of-process :class:`BatchRunner`.

Why processes: an engine crash (a segfault in a native runtime, an OOM kill) or a hang takes down
one worker, never the gateway. How workers start, die, time out and are replaced, and why their
replies are parsed, never unpickled: docs/synthesis.md, "Worker pool".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metrics import Metrics
from synth.alignment import timings_from_json, timings_to_json
from synth.cancellation import cancel_and_wait
from synth.engine import Audio, Engine, SynthesisItem
from synth.errors import (
    EngineDead,
    EngineError,
    Overloaded,
    SynthesisError,
    SynthesisTimeout,
    UnspeakableInput,
    UpstreamError,
)
from synth.scheduler import BatchClock

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


@dataclass(frozen=True)
class LogSetup:
    """How a worker process sets up its logging: ``"package.module:function"`` called with
    ``kwargs`` (picklable), so its lines come out in the gateway's format (JSON lines stay JSON)."""

    function: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def apply(self) -> None:
        """Call the function (in the worker, before anything logs)."""
        module_name, _, attr = self.function.partition(":")
        getattr(importlib.import_module(module_name), attr)(**self.kwargs)


# A worker's messages to the gateway: b"<kind>\n" + a JSON header, and for "ok" a newline and
# the items' float32 samples back to back. The header lists each item's (samples, rate).
_MAX_MESSAGE_CHARS = 500  # error texts from a worker are cut to this before they reach a client
# The errors an "error" reply may name (by class name); any other kind reads as an EngineError.
_ERRORS: dict[str, type[SynthesisError]] = {
    e.__name__: e for e in (EngineDead, Overloaded, SynthesisTimeout, UnspeakableInput)
}


def encode_ok(outputs: Sequence[Audio], **header: Any) -> bytes:
    """The "ok" reply of ``outputs`` (``header`` adds fields): each item is ``[samples, rate]``
    in its header, and the word timings third when the engine gave them (:mod:`synth.alignment`)."""
    items = [
        [len(a.pcm), a.sample_rate, *([] if a.words is None else [timings_to_json(a.words)])]
        for a in outputs
    ]
    return encode_reply("ok", {"items": items, **header}, [a.pcm for a in outputs])


def encode_reply(kind: str, header: Mapping[str, Any], pcm: Sequence[Any] = ()) -> bytes:
    """One framed worker message (runs in the worker)."""
    head = kind.encode() + b"\n" + json.dumps(header).encode()
    if kind != "ok":
        return head
    # Spaces after the JSON (which it ignores) put the samples on a 4-byte boundary, so the
    # gateway can read them in place instead of copying them out.
    head += b" " * (-(len(head) + 1) % 4)
    return b"".join([head, b"\n", *(np.ascontiguousarray(p, dtype="<f4").tobytes() for p in pcm)])


class BadReply(Exception):
    """A worker's reply that cannot be trusted: too large, malformed, or inconsistent."""


def decode_reply(data: bytes, expected_items: int) -> tuple[str, Any]:
    """``("ok", [Audio...])``, ``("error", (kind, message, header))``, ``("ready", None)`` or
    ``("failed", message)`` from one worker message; :class:`BadReply` for anything else.
    An error's ``header`` is its whole JSON object (an upstream's error carries more fields)."""
    # Offsets, not partition(): a reply is hundreds of KB of samples, and each partition copied
    # them (two copies and a third out of the buffer, on every miss).
    kind_end = data.find(b"\n")
    if kind_end < 0:
        raise BadReply("reply without a header")
    kind = data[:kind_end]
    if kind == b"ok":
        head_end = data.find(b"\n", kind_end + 1)
        if head_end < 0:
            raise BadReply("ok reply without samples")
        header = _json_object(data[kind_end + 1 : head_end])
        items = header.get("items")
        if not isinstance(items, list) or len(items) != expected_items:
            count = len(items) if isinstance(items, list) else "no"
            raise BadReply(f"reply has {count} items for a batch of {expected_items}")
        # The items another request's synthesis made (the host's pool coalesced them).
        joined = header.get("joined", [])
        if not isinstance(joined, list):
            raise BadReply("reply's joined items are not a list")
        out: list[Audio] = []
        offset = head_end + 1
        for index, item in enumerate(items):
            if (
                not isinstance(item, list)
                or len(item) not in (2, 3)
                or not all(type(v) is int for v in item[:2])
                or item[0] < 0
                or not 1 <= item[1] <= 1_000_000
            ):
                raise BadReply("reply item is not [samples, rate]")
            n, rate = item[0], item[1]
            words = None
            if len(item) == 3:
                try:
                    # (Character offsets are checked against the text where they are used.)
                    words = timings_from_json(item[2], n, 1 << 30)
                except ValueError as exc:
                    raise BadReply(f"reply item's word timings: {exc}") from exc
            end = offset + 4 * n
            if end > len(data):
                raise BadReply("reply shorter than its header says")
            pcm = np.frombuffer(data, dtype="<f4", count=n, offset=offset)
            # Read in place (read-only) when the one item is the whole reply, aligned; else a
            # copy, or a view would keep the whole reply alive as long as any one item.
            if len(items) > 1 or offset % 4:
                pcm = pcm.astype(np.float32)
            if not np.isfinite(pcm).all():
                raise BadReply("reply holds samples that are not finite")
            out.append(Audio(pcm, rate, words, joined=index in joined))
            offset = end
        if offset != len(data):
            raise BadReply("reply longer than its header says")
        return "ok", out
    header = _json_object(data[kind_end + 1 :])
    if kind == b"error":
        error_kind, message = header.get("kind"), header.get("message")
        if not isinstance(error_kind, str) or not isinstance(message, str):
            raise BadReply("error reply without kind and message")
        return "error", (error_kind, message[:_MAX_MESSAGE_CHARS], header)
    if kind == b"ready":
        return "ready", None
    if kind == b"failed":
        return "failed", str(header.get("message", ""))[:_MAX_MESSAGE_CHARS]
    raise BadReply("reply of an unknown kind")


def reply_audios(data: bytes, expected_items: int) -> list[Audio]:
    """The audio of an "ok" reply; the error an "error" reply names is raised, and
    :class:`BadReply` for a reply of any other kind."""
    kind, value = decode_reply(data, expected_items)
    if kind == "ok":
        audios: list[Audio] = value
        return audios
    if kind != "error":
        raise BadReply(f"unexpected {kind!r} reply during a batch")
    error_kind, message, header = value
    if error_kind == "UpstreamError":
        raise UpstreamError.from_wire(message, header)
    raise _ERRORS.get(error_kind, EngineError)(message)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise BadReply("reply header is not JSON") from exc
    if not isinstance(value, dict):
        raise BadReply("reply header is not a JSON object")
    return value


def _worker_main(
    spec: EngineSpec,
    threads: int,
    conn: multiprocessing.connection.Connection,
    log_setup: LogSetup | None = None,
) -> None:
    # Before torch / ONNX Runtime load: their thread pools read these once.
    for name in _THREAD_ENV:
        os.environ[name] = str(threads)
    if log_setup is not None:
        log_setup.apply()
    else:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
    try:
        engine = spec.build()
        engine.load()
        engine.warm_up()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            message = f"{type(exc).__name__}: {exc}"
            conn.send_bytes(encode_reply("failed", {"message": message}))
        raise
    conn.send_bytes(encode_reply("ready", {}))
    while True:
        try:
            items = conn.recv()
        except (EOFError, OSError):
            return  # the gateway closed the pipe: shut down
        try:
            reply = encode_ok(engine.synthesize_batch(items))
        except SynthesisError as exc:
            reply = encode_reply("error", {"kind": type(exc).__name__, "message": str(exc)})
        except Exception as exc:  # an engine bug fails this batch, not the worker
            logging.getLogger("voxgate.synth.worker").exception("batch failed")
            message = f"synthesis failed: {type(exc).__name__}"
            reply = encode_reply("error", {"kind": "EngineError", "message": message})
        conn.send_bytes(reply)


class WorkerDied(Exception):
    """The worker process ended while it held a batch (internal: triggers the retry)."""


class _Worker:
    def __init__(self, index: int, pool: WorkerPool) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.index = index
        self.pool = pool
        self.conn, child = ctx.Pipe()
        # kill() and stop() may run at once on two threads (a cancelled batch replaces its worker
        # while close() kills what is left): the pipe must be closed once, or the second close
        # hits a descriptor number the process may already have reused (EBADF in a CI run).
        self._closing = threading.Lock()
        # Batches are pipelined (WorkerPool.pipeline): a second batch is written to the pipe while
        # the first runs, and the worker reads it the moment it has sent its reply. Replies come
        # back in the order the batches went in; each caller reads its own in turn.
        self._order = threading.Condition()
        self._sent = 0  # batches written to the pipe
        self._read = 0  # replies read, or given up on
        # Once a reply could not be read cleanly the pipe's state is unknown: nothing more is
        # read from it, and the batches behind fail as if the worker had died (and are retried).
        self.broken = False
        # What broke it, for the restart metric: the batches behind fail as WorkerDied, and
        # whichever failure reaches the event loop first names the replacement.
        self.broken_by = "died"
        self.replaced = False  # the pool has retired it (event loop only)
        self.process = ctx.Process(
            target=_worker_main,
            args=(pool.specs[index], pool.threads, child, pool.log_setup),
            name=f"synth-worker-{index}",
            daemon=True,
        )
        self.process.start()
        child.close()  # only the child holds its end: its death then reads as EOF here

    def wait_ready(self) -> None:
        """Block until the worker reports ready; raise if it fails or dies first."""
        timeout_s = self.pool.start_timeout_s
        if not self.conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"synthesis worker {self.index} not ready in {timeout_s:.0f}s")
        try:
            kind, value = decode_reply(self._receive(), 0)
        except (EOFError, WorkerDied) as exc:
            raise WorkerDied(f"synthesis worker {self.index} died while loading") from exc
        except BadReply as exc:
            self.kill()
            raise EngineError(f"synthesis worker {self.index} sent a bad message: {exc}") from None
        if kind != "ready":
            self.kill()
            raise EngineError(f"synthesis worker {self.index} failed to load: {value}")

    def _receive(self) -> bytes:
        """One message, refused before it is read when it declares more than the bound."""
        try:
            return self.conn.recv_bytes(self.pool.max_reply_bytes)
        except OSError as exc:
            # multiprocessing raises OSError("bad message length") for a message over the bound,
            # before reading it; any other OSError is a broken pipe: the worker is gone.
            if "bad message length" in str(exc):
                raise BadReply(
                    f"reply larger than the {self.pool.max_reply_bytes} bytes allowed"
                ) from None
            raise WorkerDied(f"synthesis worker {self.index} died") from exc

    def call(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        """Run one batch (blocking). ``WorkerDied`` on death (or when the pipe broke under an
        earlier batch), ``TimeoutError`` past the bound, :class:`BadReply` for a reply that
        cannot be trusted. The timeout and the batch's clock count from this batch's turn: when
        the reply before it has been read, which is when the worker starts on it."""
        with self._order:
            if self.broken:
                raise WorkerDied(f"synthesis worker {self.index} is being replaced")
            ticket = self._sent
            try:
                self.conn.send(list(items))
            except (EOFError, OSError) as exc:
                self._break()
                raise WorkerDied(f"synthesis worker {self.index} died") from exc
            self._sent += 1
            while self._read != ticket and not self.broken:
                self._order.wait()
            if self.broken:
                raise WorkerDied(f"synthesis worker {self.index} died under an earlier batch")
        clean = ok = False
        failure = "error"
        clock = BatchClock(self.pool.metrics, self.pool.model)
        clock.start()
        try:
            result = self._reply(items)
            clean = ok = True
        except SynthesisError:
            clean = True  # the engine refused this batch: a whole, well-formed reply was read
            raise
        except BadReply:
            failure = "bad_reply"
            raise
        except WorkerDied:
            failure = "died"
            raise
        except TimeoutError:
            failure = "timeout"
            raise
        finally:
            with self._order:
                self._read += 1
                if not clean and not self.broken:
                    self.broken = True
                    self.broken_by = failure
                self._order.notify_all()
            clock.end(ok)
        return result

    def _break(self) -> None:
        with self._order:
            self.broken = True
            self._order.notify_all()

    def _reply(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        """Read and check this batch's reply (its turn has come)."""
        try:
            answered = self.conn.poll(self.pool.batch_timeout_s)
        except (EOFError, OSError) as exc:
            raise WorkerDied(f"synthesis worker {self.index} died") from exc
        if not answered:
            # Raised outside the try: TimeoutError is an OSError and must not read as a death.
            raise TimeoutError(f"synthesis worker {self.index} timed out")
        try:
            data = self._receive()
        except EOFError as exc:
            raise WorkerDied(f"synthesis worker {self.index} died") from exc
        return reply_audios(data, len(items))

    def _close_pipe(self) -> None:
        with self._closing:
            self.conn.close()  # (a no-op once closed; the lock makes check-and-close one step)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        # Then (a send blocked on a full pipe holds the lock until the process is gone): the
        # batches waiting for their turn fail now.
        self._break()
        self._close_pipe()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the pipe (the worker exits on EOF); kill it if it does not."""
        self._close_pipe()
        self._break()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.kill()


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
        max_reply_bytes: int = 64 * 1024 * 1024,
        log_setup: LogSetup | None = None,
        pipeline: int = 1,
    ) -> None:
        if not specs:
            raise ValueError("a worker pool needs at least one engine spec")
        if pipeline < 1:
            raise ValueError("pipeline must be >= 1")
        # Batches in flight per worker: with 2, the next batch waits in the worker's pipe while
        # one runs, so the worker starts it as soon as its reply is sent, not after the event loop
        # has taken the reply and handed out the next batch (a gap of several loop turns under
        # load). The scheduler then runs ``concurrency`` (size x pipeline) batches at once.
        self.pipeline = pipeline
        self.model = model
        self.engine = engine
        self.specs = list(specs)
        self.metrics = metrics
        self.threads = threads
        self.batch_timeout_s = batch_timeout_s
        self.start_timeout_s = start_timeout_s
        self.max_reply_bytes = max_reply_bytes
        self.log_setup = log_setup
        self._workers: dict[int, _Worker] = {}
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._replacing: set[asyncio.Task[None]] = set()
        # Workers replaced but perhaps not killed yet (their respawn task kills them first, and
        # close() may cancel it, or cancel the queued kill): close() kills what is left here.
        self._retiring: set[_Worker] = set()
        # Workers being created when close() cancelled their spawn: reaped by close().
        self._orphans: set[asyncio.Future[_Worker]] = set()
        # Blocking pipe reads and process joins run here, never on the event loop: one thread per
        # worker in flight plus one per worker (re)starting.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            (pipeline + 1) * len(self.specs) + 2, thread_name_prefix=f"pool-{model}"
        )
        self._closed = False

    @property
    def size(self) -> int:
        """Workers the pool keeps."""
        return len(self.specs)

    @property
    def concurrency(self) -> int:
        """Batches the pool takes at once: ``pipeline`` per worker."""
        return self.size * self.pipeline

    # The scheduler leaves the busy-workers gauge and the batch timings to the pool: a batch
    # waiting in a worker's pipe is in flight but not running.
    counts_syntheses = True
    times_batches = True
    cancel_when_abandoned = False
    queues_work = False
    passes_pcm = False  # a worker's reply is one message

    def _offer(self, worker: _Worker, slots: int = 1) -> None:
        for _ in range(slots):
            self._idle.put_nowait(worker)

    def worker_pids(self) -> list[int]:
        """PIDs of the workers alive and serving (idle or busy; not ones being replaced)."""
        procs = [w.process for w in self._workers.values()]
        return [p.pid for p in procs if p.pid is not None and p.is_alive()]

    async def _spawn(self, index: int) -> _Worker:
        loop = asyncio.get_running_loop()
        starting = loop.run_in_executor(self._threads, _Worker, index, self)
        try:
            worker = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Shut down while the process was being created: kill it once it exists, or it
            # would outlive the pool.
            starting.add_done_callback(_kill_when_started)
            self._orphans.add(starting)
            raise
        try:
            await loop.run_in_executor(self._threads, worker.wait_ready)
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
                self._offer(w, self.pipeline)
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
        """Kill ``worker`` and start its successor in the background (once per worker: the
        batches behind a failed one report the same worker again)."""
        if worker.replaced:
            return
        worker.replaced = True
        self._withdraw(worker)
        if self._workers.get(worker.index) is worker:
            del self._workers[worker.index]
        self._retiring.add(worker)
        self.metrics.worker_restarts.labels(self.model, reason).inc()
        log.warning(
            "synthesis worker %d (pid %s) %s; replacing it",
            worker.index,
            worker.process.pid,
            reason,
        )
        task = asyncio.create_task(self._respawn(worker), name=f"respawn-{self.model}")
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    def _withdraw(self, worker: _Worker) -> None:
        """Take ``worker``'s free slots out of the idle queue (the others keep their order)."""
        slots = [self._idle.get_nowait() for _ in range(self._idle.qsize())]
        for slot in slots:
            if slot is not worker:
                self._idle.put_nowait(slot)

    async def _respawn(self, old: _Worker) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, old.kill)
        self._retiring.discard(old)
        delay = 0.5
        while not self._closed:
            try:
                worker = await self._spawn(old.index)
            except Exception:
                log.exception("replacement for synthesis worker %d failed; retrying", old.index)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._closed:
                await loop.run_in_executor(self._threads, worker.stop)
                return
            self._workers[old.index] = worker
            self._offer(worker, self.pipeline)
            log.info("synthesis worker %d replaced (pid %s)", old.index, worker.process.pid)
            return

    async def _acquire(self) -> _Worker:
        deadline = time.monotonic() + self.batch_timeout_s
        while True:
            try:
                # (A deadline passed already makes wait_for time out at once.)
                worker = await asyncio.wait_for(self._idle.get(), deadline - time.monotonic())
            except TimeoutError:
                raise EngineDead("no synthesis worker became available") from None
            if worker.replaced:
                continue  # a slot of a worker already retired: its successor brings its own
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
                result = await loop.run_in_executor(self._threads, worker.call, list(items))
                healthy = True
                return result
            except WorkerDied:
                self._replace(worker, worker.broken_by)
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
            except Exception as exc:
                # A reply too large or malformed, or anything else not foreseen: the pipe's state
                # is unknown, so the worker is replaced, never left neither idle nor replaced.
                reason = "bad_reply" if isinstance(exc, BadReply) else "error"
                log.error(
                    "synthesis worker %d failed a batch of %d: %s: %s",
                    worker.index,
                    len(items),
                    type(exc).__name__,
                    exc,
                )
                self._replace(worker, reason)
                raise EngineError(
                    f"the synthesis worker sent an unusable reply ({type(exc).__name__}); "
                    "it was replaced"
                ) from None
            finally:
                if healthy and not worker.replaced:
                    self._offer(worker)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Stop every worker (and any replacement in progress)."""
        self._closed = True
        await cancel_and_wait(*self._replacing)
        loop = asyncio.get_running_loop()
        workers = list(self._workers.values())
        self._workers.clear()
        # Retiring workers are killed on the default executor, first: a pool thread may still be
        # blocked reading one's reply until it is killed.
        retiring = list(self._retiring)
        self._retiring.clear()
        await asyncio.gather(*(asyncio.to_thread(w.kill) for w in retiring))
        await asyncio.gather(*(loop.run_in_executor(self._threads, w.stop) for w in workers))
        await asyncio.to_thread(self._threads.shutdown, wait=True, cancel_futures=True)
        # A process created for a spawn that close() cancelled is only signalled by its done
        # callback, later, from the loop: kill and reap it here, so none outlives close().
        orphans = [
            f.result()
            for f in self._orphans
            if f.done() and not f.cancelled() and f.exception() is None
        ]
        self._orphans.clear()
        for orphan in orphans:
            await asyncio.to_thread(orphan.kill)
