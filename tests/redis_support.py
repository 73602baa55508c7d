"""Helpers for the Redis scale-out tests and bench: a loopback Redis Cluster, gateway processes.

Everything here starts real processes on free loopback ports and stops them on exit.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support import CACHE_SECRET, RedisServer, free_port, serve_command

REPO = Path(__file__).resolve().parents[1]


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port + 10000))
            return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterServers:
    """``masters`` redis-server processes joined by ``redis-cli --cluster create`` (no replicas)."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        self.nodes = [
            RedisServer(
                directory / f"node{i}",
                port=free_cluster_port(),
                extra=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ],
            )
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL seeded with the first node."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [
                subprocess.run(
                    [cli, "-p", str(n.port), "cluster", "info"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                for n in self.nodes
            ]
            if all("cluster_state:ok" in s for s in states):
                return
            time.sleep(0.1)
        raise RuntimeError("redis cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextlib.contextmanager
def redis_cluster(directory: Path, masters: int = 3) -> Iterator[RedisClusterServers]:
    """A running loopback Redis Cluster for the block."""
    cluster = RedisClusterServers(directory, masters)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


class GatewayProcess:
    """``python -m gateway serve`` in a subprocess on a free port, its own cache dir."""

    def __init__(self, cache_dir: Path, *, redis_url: str = "", args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.cache_dir = cache_dir
        # One process per replica: these tests are about replicas sharing Redis, not about the
        # gateway processes and the one synthesis pool a replica runs on a multi-core host.
        cmd = serve_command(self.port, cache_dir, "--log-level", "warning", "--workers", "1", *args)
        if redis_url:
            cmd += ["--redis-url", redis_url, "--cache-secret", CACHE_SECRET]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
        self.log_path = cache_dir.parent / f"gateway-{self.port}.log"
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until ``/readyz`` answers 200 (models warm)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log_path.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/readyz", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"gateway on {self.port} not ready: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def gateway_processes(
    directory: Path, n: int, *, redis_url: str, args: Sequence[str] = ()
) -> Iterator[list[GatewayProcess]]:
    """``n`` gateway processes sharing ``redis_url``, each with its own cache dir, all ready."""
    procs: list[GatewayProcess] = []
    try:
        for i in range(n):
            procs.append(
                GatewayProcess(directory / f"replica{i}" / "cache", redis_url=redis_url, args=args)
            )
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of metric ``name`` in a Prometheus exposition whose labels match."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if m is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


class SentinelServer:
    """A ``redis-server --sentinel`` on a free port monitoring ``master_port`` as ``service``."""

    def __init__(self, directory: Path, master_port: int, service: str = "voxgate") -> None:
        self.directory = directory
        self.port = free_port()
        self.service = service
        self.master_port = master_port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.master_port} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
        )
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.proc = subprocess.Popen(
            [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        cli = shutil.which("redis-cli") or "redis-cli"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            out = subprocess.run(
                [cli, "-p", str(self.port), "sentinel", "get-master-addr-by-name", self.service],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
            if str(self.master_port) in out:
                return
            time.sleep(0.1)
        raise RuntimeError("redis sentinel did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
