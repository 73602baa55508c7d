"""One server per port: a second ``voxgate serve`` on a served HTTP or Wyoming port exits 2
(gateway.runtime.ports), and the first goes on answering every request."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import free_port
from gateway.runtime.ports import PortInUse, check_port, hold_port
from tests.ops_support import run_cli
from tests.served import DefaultServer

# One pytest-xdist worker runs the whole module: its tests share the module-scoped server.
pytestmark = pytest.mark.xdist_group("ports")


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    server = DefaultServer(tmp_path_factory.mktemp("first"), "--wyoming-port", str(free_port()))
    with server.serving():
        yield server


def wyoming_port(server: DefaultServer) -> int:
    return int(server.proc.args[server.proc.args.index("--wyoming-port") + 1])  # type: ignore[union-attr]


def second(tmp_path: Path, *args: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = run_cli(
        "serve", "--host", "127.0.0.1", "--cache-dir", str(tmp_path / "cache"), *args, timeout=10
    )
    return done.returncode, done.stderr, time.monotonic() - started


def assert_first_answers_all(server: DefaultServer) -> None:
    statuses = [server.get("/v1/models")[0] for _ in range(30)]
    assert statuses == [200] * 30


@pytest.mark.parametrize("topology", [(), ("--workers", "1")], ids=["default", "one_process"])
def test_a_second_server_on_the_http_port_exits_2(
    first: DefaultServer, tmp_path: Path, topology: tuple[str, ...]
) -> None:
    rc, err, took = second(tmp_path, "--port", str(first.port), *topology)
    assert rc == 2, err
    assert took < 10
    lines = err.strip().splitlines()
    assert "address in use" in lines[-1]
    assert f"port {first.port} (HTTP)" in lines[-1]
    assert_first_answers_all(first)


def test_a_second_server_on_the_wyoming_port_exits_2(first: DefaultServer, tmp_path: Path) -> None:
    port = wyoming_port(first)
    rc, err, _ = second(tmp_path, "--port", str(free_port()), "--wyoming-port", str(port))
    assert rc == 2, err
    assert f"port {port} (Wyoming): address in use" in err.strip().splitlines()[-1]
    assert_first_answers_all(first)
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_a_held_port_refuses_sharers_but_not_its_own_workers() -> None:
    held = hold_port("127.0.0.1", 0, "HTTP")
    assert held is not None
    port = held.getsockname()[1]
    try:
        with pytest.raises(PortInUse, match=f"port {port} \\(HTTP\\): address in use"):
            check_port("127.0.0.1", port, "HTTP")
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen()
    finally:
        held.close()


def test_share_port_lets_a_second_server_join_on_purpose(
    first: DefaultServer, tmp_path: Path
) -> None:
    # The last --port wins: the second server is told the first one's port.
    joiner = DefaultServer(tmp_path, "--share-port", "true", "--port", str(first.port))
    try:
        joiner.port, joiner.url = first.port, first.url
        joiner.wait_ready()
        assert joiner.proc.poll() is None
        assert "address in use" not in joiner.logs()
    finally:
        assert joiner.terminate() == 0
    assert_first_answers_all(first)
