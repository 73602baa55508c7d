"""Test helpers: engine wrappers, a real redis-server, free ports. Imported by tests and conftest."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from synth.engine import Audio, Engine, ParamValue, SynthesisItem, VoiceInfo


class CountingEngine:
    """Wraps a real engine: counts items synthesized and can add a delay per batch.

    The delay makes a deliberately slow engine (to fill the queue) out of a real one; the count is
    what "exactly one synthesis" assertions read.
    """

    def __init__(self, inner: Engine, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.name = inner.name
        self.fingerprint = inner.fingerprint
        self.sample_rate = inner.sample_rate
        self.items = 0
        self.batches = 0
        self.texts: list[str] = []
        # Batches running at once, and the most seen (parallel synthesis assertions read it).
        self.active = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()

    def voices(self) -> Sequence[VoiceInfo]:
        return self.inner.voices()

    def default_params(self, voice: str) -> Mapping[str, ParamValue]:
        return self.inner.default_params(voice)

    def load(self) -> None:
        self.inner.load()

    def warm_up(self) -> None:
        self.inner.warm_up()

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        self.release.wait()
        with self._lock:
            self.active += 1
            self.max_concurrent = max(self.max_concurrent, self.active)
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            with self._lock:
                self.items += len(items)
                self.batches += 1
                self.texts.extend(i.text for i in items)
            return self.inner.synthesize_batch(items)
        finally:
            with self._lock:
                self.active -= 1

    def describe(self) -> Mapping[str, object]:
        return self.inner.describe()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real ``redis-server`` on a free loopback port, in its own temp directory."""

    def __init__(self, directory: Path, port: int | None = None,
                 extra: Sequence[str] = ()) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.2
            ) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@contextlib.contextmanager
def redis_server(directory: Path, **kw: object) -> Iterator[RedisServer]:
    """Start a redis-server for the block."""
    server = RedisServer(directory, **kw)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()
