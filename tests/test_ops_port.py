"""The ops listener (``ops_port``): health, readiness and metrics answered under a flood of the
serving port, through ``voxgate serve`` (gateway.http.connections.ops_server)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import free_port
from gateway.runtime.apikeys import key_table
from tests.canary import canary
from tests.served import DefaultServer

# One pytest-xdist worker runs the whole module: its tests share the module-scoped server.
pytestmark = pytest.mark.xdist_group("ops_port")

SPEAK_SECRET = canary("ops-port-speak")

PROBE_EVERY_S = 0.2
PROBING_S = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    directory = tmp_path_factory.mktemp("ops")
    keys_file = directory / "keys.toml"
    keys_file.write_text(key_table("ivr", SPEAK_SECRET, ["speak"]), encoding="utf-8")
    served = DefaultServer(
        directory,
        "--api-keys-file",
        str(keys_file),
        "--max-connections",
        "20",
        "--ops-port",
        str(free_port()),
    )
    with served.serving():
        yield served


def ops_url(server: DefaultServer) -> str:
    args = list(server.proc.args)  # type: ignore[arg-type]
    return f"http://127.0.0.1:{args[args.index('--ops-port') + 1]}"


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_ops_port_answers_only_probes_and_metrics(server: DefaultServer) -> None:
    ops = ops_url(server)
    assert status_of(ops + "/healthz") == 200
    assert status_of(ops + "/readyz") == 200
    assert status_of(ops + "/metrics") == 200
    assert status_of(ops + "/v1/models") == 404
    # With keys on, metrics are open only on the ops listener.
    assert server.get("/metrics")[0] == 401
    assert status_of(ops + "/metrics?x=1") == 200


def test_the_ops_port_answers_only_loopback_host_names_on_a_loopback_bind(
    server: DefaultServer,
) -> None:
    """A DNS-rebinding page that reaches the ops listener (bound to loopback, as the serving
    port: no allowed_hosts) cannot read its open /metrics: its own name as Host gets 421."""
    ops = ops_url(server)
    for path in ("/metrics", "/healthz", "/v1/models"):
        assert status_of(ops + path, {"Host": "rebound.attacker.example"}) == 421, path
    assert status_of(ops + "/metrics", {"Host": "localhost"}) == 200


def test_an_ops_listener_beyond_loopback_answers_probes_by_any_host_name(
    tmp_path: Path,
) -> None:
    """The serving port on loopback (the default: loopback Host names only), the ops listener on
    every address: the kubelet probes it by the pod's address, and is answered."""
    served = DefaultServer(tmp_path, "--ops-port", str(free_port()), "--ops-host", "0.0.0.0")
    with served.serving():
        ops = ops_url(served)
        pod = {"Host": "10.1.2.3:8081"}
        assert [status_of(ops + p, pod) for p in ("/healthz", "/readyz", "/metrics")] == [200] * 3
        assert status_of(served.url + "/healthz", pod) == 421  # (the serving port's bind)


def test_probes_answer_while_the_serving_port_is_flooded(server: DefaultServer) -> None:
    ops = ops_url(server)
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(60)]
    stop = threading.Event()
    opened = 0

    def keep_opening() -> None:
        nonlocal opened
        held: list[socket.socket] = []
        while not stop.is_set():
            try:
                held.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
                opened += 1
            except OSError:
                continue
            if len(held) > 40:
                held.pop(0).close()
        for sock in held:
            sock.close()

    flooder = threading.Thread(target=keep_opening)
    flooder.start()
    statuses: list[int] = []
    try:
        # The serving port really is full: its connection cap answers 503. Asked until it does:
        # the kernel spreads connections over the processes by their addresses, and one that
        # got fewer than its cap of the 60 (about 1 run in 300) fills only as the flood goes on.
        full_by = time.monotonic() + 60
        while server.get("/v1/models")[0] != 503:
            assert time.monotonic() < full_by, "the serving port never filled"
        # Counted in rounds, not seconds: a slow machine probes as often, only later. The
        # flood must also have reached its size (on a loaded machine it may take longer).
        rounds = round(PROBING_S / PROBE_EVERY_S)
        give_up = time.monotonic() + 120
        while (len(statuses) < 2 * rounds or opened <= 100) and time.monotonic() < give_up:
            statuses += [status_of(ops + "/healthz"), status_of(ops + "/readyz")]
            time.sleep(PROBE_EVERY_S)
    finally:
        stop.set()
        flooder.join()
        for sock in idle:
            sock.close()
    assert opened > 100
    assert len(statuses) >= 2 * round(PROBING_S / PROBE_EVERY_S)
    assert statuses == [200] * len(statuses)
