"""Helpers for the Redis tests: a loopback Redis Cluster and a Sentinel (a single redis-server and
gateway replicas sharing it are in :mod:`bench.harness`, which the benches use too).

Everything here starts real processes on free loopback ports and stops them on exit.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from bench.harness import RedisServer, free_port
from cache.entry import Entry

# The callbacks a CrossReplicaFlight takes, where a test only needs one to be called or not.


async def adopted(entry: Entry) -> str:
    """A waiter takes what the lock's holder stored."""
    return "adopted"


async def nothing_stored(entry: Entry) -> NoReturn:
    raise AssertionError("nothing is stored: no waiter adopts")


async def must_not_produce() -> NoReturn:
    raise AssertionError("the waiter must not produce")


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
