"""``voxgate serve --workers N``: N gateway processes on one port, supervised by this one.

Each worker is a full gateway (``python -m gateway serve`` with the same arguments). How they
share the port, the disk tier (diskcache is safe across processes: SQLite plus atomic file writes)
and the metrics, and how the supervisor restarts and stops them: docs/deploy.md ("Several
processes on one host"); it forwards SIGHUP too (each worker reloads its API keys). Key budgets
and queue shares are the host's: :mod:`gateway.runtime.hostshare`.

Why the gateway processes are forks and the pool process (``--serve-pool``) a new interpreter:
that section too. A fork holds nothing a child must not share: the supervisor is single-threaded
and has no event loop, sockets or engines open.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from prometheus_client import multiprocess, values

from gateway.runtime.hostshare import HOST_TABLE_ENV, HostTable
from gateway.runtime.settings import Settings
from metrics import MULTIPROC_ENV

# Set in each worker of `serve --workers N`: its index. Its listeners (HTTP, Wyoming) share their
# ports with the other workers through SO_REUSEPORT.
WORKER_INDEX_ENV = "VOXGATE_WORKER_INDEX"
# Set in each gateway process when the host runs one synthesis pool process for all of them: the
# Unix socket it listens on (gateway/runtime/poolhost.py).
POOL_SOCKET_ENV = "VOXGATE_POOL_SOCKET"

log = logging.getLogger("voxgate.workers")
# The modules a gateway process imports to serve (gateway.cli.serve._serve), beyond the command's.
GATEWAY_MODULES = (
    "gateway.http.app",
    "gateway.http.connections",
    "gateway.http.hits",
    "gateway.runtime.components",
)
# A worker that dies this soon after starting, this many times in a row, is not restarted again.
FAST_FAILURE_S = 10.0
MAX_FAST_FAILURES = 3
# Beyond the drain timeout, how long a worker may take to close pools and exit.
EXIT_GRACE_S = 15.0


def reserve_port(host: str) -> socket.socket:
    """A socket bound (not listening) to a free port with SO_REUSEPORT, held so the port stays
    ours while the workers bind it too. A bound, non-listening socket receives no connections."""
    family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return sock


def prepare_metrics_dir() -> tuple[str, bool]:
    """The multiprocess metrics directory (``$PROMETHEUS_MULTIPROC_DIR`` or a new temp dir),
    emptied: files left by an earlier run would add their counts to this one's."""
    given = os.environ.get(MULTIPROC_ENV)
    if not given:
        return tempfile.mkdtemp(prefix="voxgate-metrics-"), True
    path = Path(given)
    path.mkdir(parents=True, exist_ok=True)
    for db in path.glob("*.db"):
        db.unlink()
    return str(path), False


class ForkedChild:
    """A gateway process forked from the supervisor, watched as :class:`subprocess.Popen` would."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        # Popen.wait(timeout) polls the same way: waitpid has no timeout of its own.
        while (rc := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.02)
        return rc

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# A process the supervisor runs: the synthesis pool process, or a forked gateway process.
Child = subprocess.Popen[bytes] | ForkedChild
# A gateway process's entry point: ``voxgate ARGV`` (``serve`` and its flags); the exit status.
Entry = Callable[[Sequence[str]], int]


def _forked_main(entry: Entry, argv: Sequence[str], env: dict[str, str]) -> NoReturn:
    """The forked child: the environment and signal handlers a new interpreter would have, then
    the command; it never returns into the supervisor's code (whose cleanup is the parent's)."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # prometheus-client picks its value class from the environment when it is imported,
        # which the supervisor did without the multiprocess directory set.
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
        code = entry(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("gateway process failed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Supervisor:
    """Starts, watches and stops the worker processes."""

    def __init__(
        self,
        settings: Settings,
        argv: Sequence[str],
        entry: Entry,
        port: int,
        metrics_dir: str,
        pool_socket: str | None,
        host_table: str,
    ):
        self.settings = settings
        self.argv = list(argv)
        self.entry = entry
        self.port = port
        self.metrics_dir = metrics_dir
        # With a synthesis pool, the last process is the host's one pool process:
        # started first, stopped last, restarted like the others.
        self.pool_socket = pool_socket
        self.host_table = host_table
        self.gateways = settings.topology().gateway_processes
        self.procs: list[Child] = []
        self.started: list[float] = []
        self.fast_failures: list[int] = []
        self.stopping = False
        self.failed = False

    def spawn(self, index: int) -> Child:
        # The last flags win in argparse: the worker is a single-process server on our port, with
        # the counts resolved here (a worker resolving `auto` alone would take every core for its
        # own synthesis pool).
        topology = self.settings.topology()
        args = [
            *self.argv,
            "--workers",
            "1",
            "--synth-workers",
            str(topology.synth_workers),
            "--intra-op-threads",
            str(topology.intra_op_threads),
            "--port",
            str(self.port),
            "--worker-of",
            str(os.getpid()),
        ]
        env = {**os.environ, MULTIPROC_ENV: self.metrics_dir}
        env.pop(POOL_SOCKET_ENV, None)
        env.pop(HOST_TABLE_ENV, None)
        if self.pool_socket is not None and index == self.gateways:
            # Every gateway process hands the pool its misses at once (components.handover): the
            # pool's one queue holds queue_size per gateway process, in order of arrival.
            queue = self.settings.queue_size * self.gateways
            args += ["--serve-pool", self.pool_socket, "--queue-size", str(queue)]
            proc = subprocess.Popen([sys.executable, "-m", "gateway", *args], env=env)
            log.info("synthesis pool process started (pid %d)", proc.pid)
            return proc
        # Before the first fork (no threads, loops or engines come with these imports), after the
        # pool process is started: the gateways wait for its socket, so its start overlaps them.
        for module in GATEWAY_MODULES:
            importlib.import_module(module)
        env[WORKER_INDEX_ENV] = str(index)
        env[HOST_TABLE_ENV] = self.host_table
        if self.pool_socket is not None:
            env[POOL_SOCKET_ENV] = self.pool_socket
        # Buffered output would be written twice, once by each process.
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _forked_main(self.entry, args, env)
        child = ForkedChild(pid)
        log.info("worker %d started (pid %d)", index, child.pid)
        return child

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        # Every worker holds its own copy of the API keys: each rereads the file. The pool
        # process makes the host's upstream calls: it rereads the upstreams file.
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGHUP)

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (or repeated worker failure); the exit status."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hangup)
        n = self.gateways + (1 if self.pool_socket is not None else 0)
        # The pool process first: the gateways wait for its socket before they report ready.
        self.procs = [self.spawn(i) for i in reversed(range(n))][::-1]
        self.started = [time.monotonic()] * n
        self.fast_failures = [0] * n
        log.info(
            "serving on port %d with %d workers%s",
            self.port,
            self.gateways,
            " and one synthesis pool process" if self.pool_socket is not None else "",
        )
        while not self.stopping:
            self._repair_table()
            self._reap()
            time.sleep(0.2)
        return self._stop()

    def _repair_table(self) -> None:
        """Rebuild the host table if something cut, overwrote, deleted or replaced it (the
        gateways find it damaged under their lock and count locally meanwhile, or follow the
        rebuilt file once theirs has no link left): rate windows and queue shares start over,
        the server goes on."""
        try:
            if HostTable.repair(self.host_table, self.gateways):
                log.error("host table %s was damaged; rebuilt it empty", self.host_table)
        except OSError as exc:
            log.error("host table %s could not be rebuilt: %s", self.host_table, exc)

    def _reap(self) -> None:
        for i, proc in enumerate(self.procs):
            rc = proc.poll()
            if rc is None:
                continue
            # Drop the dead worker's live gauges; its counters stay (they were really counted).
            multiprocess.mark_process_dead(proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
            lived = time.monotonic() - self.started[i]
            self.fast_failures[i] = self.fast_failures[i] + 1 if lived < FAST_FAILURE_S else 0
            what = "synthesis pool process" if i == self.gateways else f"worker {i}"
            if self.fast_failures[i] >= MAX_FAST_FAILURES:
                log.error("%s keeps failing (exit %s); stopping", what, rc)
                self.failed = True
                self.stopping = True
                return
            log.error("%s (pid %d) exited with %s; restarting", what, proc.pid, rc)
            if self.fast_failures[i]:
                time.sleep(1.0)
            self._repair_table()  # the likeliest cause of a gateway's SIGBUS
            self.procs[i] = self.spawn(i)
            self.started[i] = time.monotonic()

    def _stop(self) -> int:
        log.info("stopping %d workers", self.gateways)
        deadline = time.monotonic() + self.settings.shutdown_timeout_s + EXIT_GRACE_S
        ok = not self.failed
        # Gateways first (their in-flight misses still need the pool), then the pool process.
        ok = self._terminate(self.procs[: self.gateways], deadline) and ok
        deadline = time.monotonic() + EXIT_GRACE_S
        return 0 if self._terminate(self.procs[self.gateways :], deadline) and ok else 1

    def _terminate(self, procs: Sequence[Child], deadline: float) -> bool:
        """SIGTERM ``procs`` and wait for them (killed past ``deadline``); all exited 0?"""
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        ok = True
        for proc in procs:
            try:
                rc = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not exit in time; killing it", proc.pid)
                proc.kill()
                rc = proc.wait()
            ok = ok and rc == 0
        return ok


def run_workers(settings: Settings, argv: Sequence[str], entry: Entry) -> int:
    """Serve with ``settings.topology().gateway_processes`` processes, each a fork running
    ``entry`` on the worker's flags; the exit status."""
    metrics_dir, own_dir = prepare_metrics_dir()
    holder = reserve_port(settings.host) if settings.port == 0 else None
    port = holder.getsockname()[1] if holder is not None else settings.port
    # One synthesis pool for the host when synthesis runs in worker processes: a private
    # directory (0700) for its socket.
    pool_dir = tempfile.mkdtemp(prefix="voxgate-pool-") if settings.pool_workers() else None
    pool_socket = os.path.join(pool_dir, "pool.sock") if pool_dir is not None else None
    host_table = HostTable.create(settings.topology().gateway_processes)
    try:
        return Supervisor(settings, argv, entry, port, metrics_dir, pool_socket, host_table).run()
    finally:
        Path(host_table).unlink(missing_ok=True)
        if holder is not None:
            holder.close()
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if pool_dir is not None:
            shutil.rmtree(pool_dir, ignore_errors=True)


async def watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop this worker if its supervisor is gone (killed without forwarding a signal)."""
    # Polling: there is no event to await for "my parent died" short of prctl(PDEATHSIG).
    while os.getppid() == parent_pid:  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    log.error("supervisor (pid %d) is gone; shutting down", parent_pid)
    stop.set()
