"""One host, one gateway: the gateway processes of `voxgate serve` share each API key's budget
and each client's queue share without Redis (gateway/runtime/hostshare.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gateway.errors import TooManyRequests
from gateway.runtime.apikeys import APIKey, key_table
from gateway.runtime.hostshare import HostShares, HostTable
from gateway.runtime.ratelimit import KeyLimits
from gateway.runtime.topology import usable_cores
from metrics import Metrics
from synth.engine import Audio, SynthesisItem
from synth.errors import ClientQueueFull
from synth.scheduler import Scheduler
from tests.canary import canary
from tests.served import DefaultServer
from tests.support import ThreadRunnerFlags, clear_of_a_minute_edge, until

SECRET = canary("host-share")
OTHER = "host-share-other-0123456789-abcdefghijk"


@pytest.fixture
def table_path(tmp_path: Path) -> Iterator[str]:
    path = HostTable.create(2, directory=str(tmp_path))
    yield path
    os.unlink(path)


def test_two_processes_spend_one_window(table_path: str) -> None:
    a, b = HostTable(table_path, 0), HostTable(table_path, 1)
    now = 6000.0
    got = [(a if i % 2 else b).hit_window("r:ivr", 3, 60, 1, now + i) for i in range(6)]
    assert [ok for ok, _ in got] == [True, True, True, False, False, False]
    assert all(retry >= 1.0 for ok, retry in got if not ok)
    # The next window weighs the previous one by what is left of it inside the sliding window:
    # 30 s into it, half of the 3 still counts (floor(1.5) + 1 <= 3: one more is admitted).
    assert a.hit_window("r:ivr", 3, 60, 1, 6090.0) == (True, 0.0)
    assert b.hit_window("r:ivr", 3, 60, 1, 6090.5) == (True, 0.0)
    assert a.hit_window("r:ivr", 3, 60, 1, 6091.0)[0] is False
    # Two windows later nothing of it is left.
    assert b.hit_window("r:ivr", 3, 60, 3, 6200.0) == (True, 0.0)
    # A cost over the limit is never admitted, whatever is left.
    assert a.hit_window("c:other", 10, 60, 11, now)[0] is False
    a.close()
    b.close()


def test_a_process_that_starts_again_drops_what_its_predecessor_had_waiting(
    table_path: str,
) -> None:
    a, b = HostTable(table_path, 0), HostTable(table_path, 1)
    assert [a.take_share("ivr", 3), b.take_share("ivr", 3), a.take_share("ivr", 3)] == [True] * 3
    assert b.take_share("ivr", 3) is False and a.waiting_for("ivr") == 3
    b.give_share("ivr")
    assert a.waiting_for("ivr") == 2
    a.close()
    restarted = HostTable(table_path, 0)  # process 0 died with 2 waiting and was restarted
    assert restarted.waiting_for("ivr") == 0 and b.waiting_for("ivr") == 0
    restarted.close()
    b.close()


def test_a_full_table_reuses_stale_rows_then_says_so(tmp_path: Path) -> None:
    path = HostTable.create(1, directory=str(tmp_path), rows=4)
    table = HostTable(path, 0)
    for i in range(4):
        assert table.hit_window(f"r:k{i}", 5, 60, 1, 600.0) == (True, 0.0)
    assert table.hit_window("r:new", 5, 60, 1, 600.0) is None  # every row is live
    # Two periods later every row is stale: a new identity takes one.
    assert table.hit_window("r:new", 5, 60, 1, 800.0) == (True, 0.0)
    for i in range(4):
        assert table.take_share(f"c{i}", 2) is True
    assert table.take_share("c-new", 2) is None
    table.give_share("c0")
    assert table.take_share("c-new", 2) is True  # c0's row holds nothing: reused
    table.close()


@pytest.fixture
def one_row(tmp_path: Path) -> Iterator[HostTable]:
    table = HostTable(HostTable.create(1, directory=str(tmp_path), rows=1), 0)
    yield table
    table.close()


async def test_key_limits_fall_back_to_the_process_when_the_table_is_full(
    one_row: HostTable,
) -> None:
    metrics = Metrics()
    limits = KeyLimits(metrics)
    limits.host = one_row
    one = APIKey("one", b"", frozenset({"speak"}), requests_per_minute=2)
    two = APIKey("two", b"", frozenset({"speak"}), requests_per_minute=2)
    await clear_of_a_minute_edge()
    await limits.admit_request(one)
    await limits.admit_request(two)  # no room in the table: counted in this process
    await limits.admit_request(two)
    with pytest.raises(TooManyRequests, match="over its limit of 2 requests"):
        await limits.admit_request(two)
    assert metrics.host_table_full._value.get() == 3


class Held(ThreadRunnerFlags):
    """A runner whose batches wait for ``release``: items stay queued behind it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        import numpy as np

        self.running += 1
        await self.release.wait()
        return [Audio(np.zeros(160, dtype=np.float32), 16000) for _ in items]


@pytest.fixture
def two_processes(table_path: str) -> Iterator[list[HostTable]]:
    tables = [HostTable(table_path, 0), HostTable(table_path, 1)]
    yield tables
    for t in tables:
        t.close()


async def test_two_gateway_processes_give_a_client_one_queue_share(
    two_processes: list[HostTable],
) -> None:
    """Two schedulers (as two gateway processes, each with its own queue) over one host table:
    a client's waiting items count once for the host."""
    metrics = Metrics()
    runners = [Held(), Held()]
    schedulers = [
        Scheduler(
            "m",
            runner,
            metrics,
            max_queue=16,
            max_per_client=3,
            shares=HostShares(table),
        )
        for table, runner in zip(two_processes, runners, strict=True)
    ]
    for s in schedulers:
        s.start()

    def submit(i: int) -> asyncio.Future[Audio]:
        return asyncio.ensure_future(schedulers[i % 2].submit(SynthesisItem(f"t{i}", "v"), "ivr"))

    tasks = [submit(0), submit(1)]
    try:
        # One item of each process runs (held); then three wait across the two queues.
        await until(lambda: runners[0].running == runners[1].running == 1)
        tasks += [submit(i) for i in (2, 3, 4)]
        await until(lambda: schedulers[0].waiting_for("ivr") == 3)
        for s in schedulers:
            with pytest.raises(ClientQueueFull):
                await s.submit(SynthesisItem("one more", "v"), "ivr")
        other = asyncio.ensure_future(schedulers[1].submit(SynthesisItem("x", "v"), "other"))
        for r in runners:
            r.release.set()
        await asyncio.gather(*tasks, other)
        assert schedulers[1].waiting_for("ivr") == 0
    finally:
        for s in schedulers:
            await s.close()


async def test_a_keys_budget_is_the_hosts_under_the_default_topology(tmp_path: Path) -> None:
    """`voxgate serve` with no flags (a gateway process per core): a key with
    requests_per_minute = 3 gets 3 answers in a minute, not 3 per process."""
    keys = tmp_path / "keys.toml"
    keys.write_text(
        key_table("ivr", SECRET, ["speak", "read"], requests_per_minute=3)
        + "\n"
        + key_table("other", OTHER, ["speak", "read"])
    )
    server = DefaultServer(tmp_path / "srv", "--api-keys-file", str(keys))
    try:
        server.wait_ready()
        assert server.gateways == usable_cores()
        await clear_of_a_minute_edge()
        statuses = [
            (await server.request("GET", "/v1/models", headers={"X-API-Key": SECRET}))[0]
            for _ in range(10)
        ]
        assert sorted(statuses) == [200] * 3 + [429] * 7
        # Another key's budget is its own.
        status, _, _ = await server.request("GET", "/v1/models", headers={"X-API-Key": OTHER})
        assert status == 200
    finally:
        server.close()
    assert SECRET not in server.logs()


async def test_during_a_redis_outage_a_key_keeps_one_budget_per_host(
    two_processes: list[HostTable],
) -> None:
    """Two gateway processes of one host, their Redis down: the fallback counts in the host's
    table, so the key's limit holds for the host, not once per process."""
    from bench.harness import CACHE_SECRET, free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    metrics = Metrics()
    processes = [
        KeyLimits(metrics, redis_url=url, secret=CACHE_SECRET.encode(), timeout_s=0.2)
        for _ in two_processes
    ]
    for limits, table in zip(processes, two_processes, strict=True):
        limits.host = table
        await limits.start()
    key = APIKey("ivr", b"\0" * 32, frozenset({"speak"}), requests_per_minute=3)
    await clear_of_a_minute_edge()
    admitted = 0
    try:
        for i in range(8):
            try:
                await processes[i % 2].admit_request(key)
                admitted += 1
            except TooManyRequests:
                pass
    finally:
        for limits in processes:
            await limits.close()
    assert admitted == 3
    assert metrics.registry.get_sample_value("voxgate_rate_limit_fallbacks_total") == 8


def test_a_damaged_table_is_refused_at_start_and_repaired(tmp_path: Path) -> None:
    bad = tmp_path / "bad.table"
    bad.write_bytes(b"not a table at all" * 4096)
    short = Path(HostTable.create(2, directory=str(tmp_path)))
    os.truncate(short, HostTable.size_for(4096, 4096, 2) // 2)
    for path in (bad, short):
        with pytest.raises(ValueError, match="not a whole voxgate host table"):
            HostTable(str(path), 0)
        assert HostTable.repair(str(path), 2) is True
        assert HostTable.repair(str(path), 2) is False
        table = HostTable(str(path), 1)
        assert table.take_share("ivr", 1) is True
        table.close()


def test_a_table_cut_under_its_mapping_answers_none_until_repaired(table_path: str) -> None:
    a, b = HostTable(table_path, 0), HostTable(table_path, 1)
    assert a.take_share("ivr", 5) is True
    # Touching a word past the end of the file would kill this process with SIGBUS.
    os.truncate(table_path, 0)
    assert a.take_share("ivr", 5) is None
    assert b.hit_window("r:ivr", 3, 60, 1, 6000.0) is None
    assert a.waiting_for("ivr") == 0
    a.give_share("ivr")
    assert HostTable.repair(table_path, 2) is True
    # The same mappings reach the rebuilt (empty) table.
    assert b.take_share("ivr", 5) is True and a.waiting_for("ivr") == 1
    assert a.hit_window("r:ivr", 3, 60, 1, 6000.0) == (True, 0.0)
    a.close()
    b.close()


def replace(path: str, how: str) -> None:
    """Take the table at ``path`` away from its mappings: ``deleted``, or ``renamed over`` by a
    file of garbage of the table's size."""
    if how == "deleted":
        os.unlink(path)
        return
    garbage = f"{path}.new"
    Path(garbage).write_bytes(os.urandom(os.stat(path).st_size))
    os.replace(garbage, path)


@pytest.mark.parametrize("how", ["deleted", "renamed over"])
def test_a_table_replaced_under_its_mapping_is_followed_once_rebuilt(
    table_path: str, how: str
) -> None:
    a, b = HostTable(table_path, 0), HostTable(table_path, 1)
    assert a.take_share("ivr", 5) is True
    replace(table_path, how)
    # Nothing whole at the path yet: the old file still serves the processes that map it.
    assert b.take_share("ivr", 5) is True and a.waiting_for("ivr") == 2
    assert HostTable.repair(table_path, 2) is True
    # Each process maps the rebuilt (empty) table at its next call; one started since (a
    # gateway the supervisor restarted) counts in the same table.
    assert a.take_share("ivr", 5) is True and b.waiting_for("ivr") == 1
    restarted = HostTable(table_path, 1)
    assert restarted.take_share("ivr", 5) is True
    assert a.waiting_for("ivr") == b.waiting_for("ivr") == 2
    assert b.hit_window("r:ivr", 1, 60, 1, 6000.0) == (True, 0.0)
    assert restarted.hit_window("r:ivr", 1, 60, 1, 6000.5)[0] is False
    for table in (a, b, restarted):
        table.close()


def _host_tables_of(pid: int) -> list[str]:
    """What the gateway processes of a `voxgate serve` supervisor hold open as their host table
    (a file no longer at its path reads "... (deleted)")."""
    held = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent != pid:
                continue
            for fd in (stat.parent / "fd").iterdir():
                target = os.readlink(fd)
                if "voxgate-host-" in target:
                    held.append(target)
        except (OSError, IndexError, ValueError):
            continue
    assert held, "no gateway process holds a host table"
    return held


@pytest.mark.parametrize("how", ["cut", "deleted", "renamed over"])
async def test_damaging_the_table_under_the_default_topology_stops_nothing(
    tmp_path: Path, how: str
) -> None:
    """`voxgate serve` with no flags, its /dev/shm table truncated, deleted, or renamed over by
    garbage of its size while it serves: requests keep being answered (each spends the key's
    host-wide budget in the table), the supervisor rebuilds the table, and every gateway
    process maps the rebuilt one."""
    keys = tmp_path / "keys.toml"
    keys.write_text(key_table("ivr", SECRET, ["speak", "read"], requests_per_minute=1000))
    server = DefaultServer(tmp_path / "srv", "--api-keys-file", str(keys))
    try:
        server.wait_ready()
        held = _host_tables_of(server.proc.pid)
        path = held[0]
        size = os.stat(path).st_size
        models = {"X-API-Key": SECRET}
        assert (await server.request("GET", "/v1/models", headers=models))[0] == 200
        if how == "cut":
            os.truncate(path, 0)
        else:
            replace(path, how)
        statuses = [
            (await server.request("GET", "/v1/models", headers=models))[0] for _ in range(30)
        ]
        assert statuses == [200] * 30
        await until(lambda: "was damaged; rebuilt it empty" in server.logs(), 10, "a log line")
        assert os.stat(path).st_size == size

        async def all_map_the_rebuilt_table() -> bool:
            # (each gateway follows at its next call: requests reach them all)
            assert (await server.request("GET", "/v1/models", headers=models))[0] == 200
            return _host_tables_of(server.proc.pid) == [path] * len(held)

        for _ in range(200):
            if await all_map_the_rebuilt_table():
                break
        assert _host_tables_of(server.proc.pid) == [path] * len(held)
        assert server.proc.poll() is None
        assert "Bus error" not in server.logs() and "exited with" not in server.logs()
    finally:
        server.close()
