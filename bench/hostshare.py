"""The host's shared table (``gateway/runtime/hostshare.py``, hand-written on a file in
``/dev/shm``) against the library it stands in for: stdlib ``sqlite3`` with its database on
``/dev/shm``, the same operations from several processes at once, in one run.

What the gateway does with the table on its hot paths, and what each process here does per step:

- ``hit_window``: every request of an API key spends one unit of its ``requests_per_minute``
  (``gateway/runtime/ratelimit.py``): the sliding-window counter read, rolled over when its window
  ended, checked against the limit and incremented;
- ``take_share`` then ``give_share``: every miss queued takes one of its client's
  ``queue_per_client`` items for the host and gives it back when answered (``HostShares``).

Each step picks one of ``--keys`` keys and one of ``--clients`` clients; every process of a round
starts its steps at one barrier. The two implementations take turns, round after round (A B, B A,
...), each round on a fresh table, so a change in the machine's speed falls on both alike. Per
operation, the latency of every call (``perf_counter_ns`` around it: the lock, the lookup and the
update, as the gateway pays them); per round, the steps per second of all processes together.

Both must count alike: every key's limit is set to 90% of the hits it gets, so the refusing branch
runs too, and a round fails unless each key admitted exactly its limit over all processes (a lost
update under concurrency would show) and every client's share count is back to zero.

The SQLite side is written as one would to replace the table: one connection per process, WAL
(or ``--journal``), ``synchronous = OFF`` (the file is in memory), the window's read-modify-write
in one ``BEGIN IMMEDIATE`` transaction, a share taken by one conditional ``INSERT ... ON CONFLICT``
statement and given back by one ``UPDATE`` (a single writing statement is atomic by itself).

    python -m bench.hostshare [--rounds 6] [--steps 20000] [--processes 2]

Writes docs/bench/hostshare.json and docs/bench/hostshare.png.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from bench.common import bar_plot, provenance, write_results
from gateway.runtime.hostshare import HostTable

IMPLEMENTATIONS = ("hostshare", "sqlite3")
OPERATIONS = ("hit_window", "take_share", "give_share")
# A window no round outlives: each key's admitted count is then exactly its limit.
EXPIRY_S = 1 << 30
SHARE_LIMIT = 16


def shm_directory() -> str | None:
    """``/dev/shm`` where it is writable (where both implementations keep their file)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class Table(Protocol):
    def hit_window(
        self, identity: str, limit: int, expiry: int, cost: int, now: float
    ) -> tuple[bool, float] | None: ...

    def take_share(self, client: str, limit: int) -> bool | None: ...

    def give_share(self, client: str) -> None: ...

    def waiting_for(self, client: str) -> int: ...

    def close(self) -> None: ...


class SqliteTable:
    """The table's hot-path operations on a SQLite database shared by the host's processes."""

    def __init__(self, path: str, process: int) -> None:
        # isolation_level=None: autocommit; transactions are begun explicitly where needed.
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.db.execute("PRAGMA synchronous = OFF")
        self.process = process

    @classmethod
    def create(cls, journal: str, directory: str | None = None) -> str:
        """A new database with both tables (in ``directory``, else /dev/shm); its path."""
        fd, path = tempfile.mkstemp(
            prefix="voxgate-bench-", suffix=".sqlite", dir=directory or shm_directory()
        )
        os.close(fd)
        db = sqlite3.connect(path, isolation_level=None)
        db.execute(f"PRAGMA journal_mode = {journal}")
        db.execute(
            "CREATE TABLE windows (identity TEXT PRIMARY KEY, expiry INTEGER, window INTEGER,"
            " previous INTEGER, current INTEGER) WITHOUT ROWID"
        )
        db.execute(
            "CREATE TABLE shares (client TEXT, process INTEGER, count INTEGER,"
            " PRIMARY KEY (client, process)) WITHOUT ROWID"
        )
        db.close()
        return path

    def hit_window(
        self, identity: str, limit: int, expiry: int, cost: int, now: float
    ) -> tuple[bool, float]:
        """As :meth:`HostTable.hit_window` (the same sliding window; a refusal's retry time is
        left out: it is computed after the lock in both, and refusals are rare)."""
        window = int(now // expiry)
        current_left = expiry - (now % expiry)
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT expiry, window, previous, current FROM windows WHERE identity = ?",
                (identity,),
            ).fetchone()
            previous, current = (row[2], row[3]) if row else (0, 0)
            if row is None or row[0] != expiry or row[1] != window:
                rolled = row is not None and row[0] == expiry and row[1] == window - 1
                previous, current = (current if rolled else 0), 0
            admitted = (
                cost <= limit
                and math.floor(previous * current_left / expiry + current) + cost <= limit
            )
            db.execute(
                "INSERT INTO windows VALUES (?, ?, ?, ?, ?) ON CONFLICT (identity) DO UPDATE SET"
                " expiry = excluded.expiry, window = excluded.window,"
                " previous = excluded.previous, current = excluded.current",
                (identity, expiry, window, previous, current + cost if admitted else current),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return admitted, 0.0 if admitted else 1.0

    def take_share(self, client: str, limit: int) -> bool:
        cursor = self.db.execute(
            "INSERT INTO shares (client, process, count) SELECT ?, ?, 1"
            " WHERE (SELECT coalesce(sum(count), 0) FROM shares WHERE client = ?) < ?"
            " ON CONFLICT (client, process) DO UPDATE SET count = count + 1",
            (client, self.process, client, limit),
        )
        return cursor.rowcount == 1

    def give_share(self, client: str) -> None:
        self.db.execute(
            "UPDATE shares SET count = count - 1 WHERE client = ? AND process = ? AND count > 0",
            (client, self.process),
        )

    def waiting_for(self, client: str) -> int:
        row = self.db.execute(
            "SELECT coalesce(sum(count), 0) FROM shares WHERE client = ?", (client,)
        ).fetchone()
        return int(row[0])

    def close(self) -> None:
        self.db.close()


def open_table(implementation: str, path: str, process: int) -> Table:
    if implementation == "hostshare":
        return HostTable(path, process)
    return SqliteTable(path, process)


def worker(
    implementation: str,
    path: str,
    process: int,
    steps: int,
    keys: int,
    clients: int,
    limit: int,
    barrier: Any,
    results: Any,
) -> None:
    """One gateway process's share of a round: ``steps`` steps, every call timed."""
    table = open_table(implementation, path, process)
    latencies: dict[str, list[int]] = {op: [] for op in OPERATIONS}
    admitted = [0] * keys
    refused_shares = 0
    identities = [f"r:key-{k}" for k in range(keys)]
    names = [f"client-{c}" for c in range(clients)]
    clock = time.perf_counter_ns
    barrier.wait()
    started = clock()
    for step in range(steps):
        k = (step * 7 + process) % keys
        client = names[(step * 11 + process) % clients]
        t0 = clock()
        got = table.hit_window(identities[k], limit, EXPIRY_S, 1, time.time())
        t1 = clock()
        taken = table.take_share(client, SHARE_LIMIT)
        t2 = clock()
        if taken:
            table.give_share(client)
        else:
            refused_shares += 1
        t3 = clock()
        latencies["hit_window"].append(t1 - t0)
        latencies["take_share"].append(t2 - t1)
        latencies["give_share"].append(t3 - t2)
        if got is not None and got[0]:
            admitted[k] += 1
    elapsed = clock() - started
    table.close()
    results.put((process, elapsed, latencies, admitted, refused_shares))


def one_round(
    implementation: str, processes: int, steps: int, keys: int, clients: int, journal: str
) -> dict[str, Any]:
    """Every process's steps on a fresh table; checks that the table counted alike."""
    if implementation == "hostshare":
        path = HostTable.create(processes, directory=shm_directory())
    else:
        path = SqliteTable.create(journal)
    hits_per_key = steps * processes // keys
    limit = hits_per_key * 9 // 10
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    try:
        children = [
            ctx.Process(
                target=worker,
                args=(implementation, path, p, steps, keys, clients, limit, barrier, results),
            )
            for p in range(processes)
        ]
        for child in children:
            child.start()
        reports = [results.get(timeout=600) for _ in children]
        for child in children:
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"{implementation} worker exited {child.exitcode}")
        table = open_table(implementation, path, 0)
        waiting = sum(table.waiting_for(f"client-{c}") for c in range(clients))
        table.close()
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)
    admitted = [sum(r[3][k] for r in reports) for k in range(keys)]
    if (
        any(a != min(limit, hits_per_key) for a in admitted)
        or waiting
        or any(r[4] for r in reports)
    ):
        raise RuntimeError(
            f"{implementation} counted wrong: admitted {sorted(set(admitted))} of limit {limit},"
            f" {waiting} shares left waiting, {sum(r[4] for r in reports)} shares refused"
        )
    wall_ns = max(r[1] for r in reports)
    return {
        "steps_per_s": round(steps * processes / (wall_ns / 1e9)),
        "latencies_ns": {op: [v for r in reports for v in r[2][op]] for op in OPERATIONS},
    }


def percentile(values: Sequence[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def run(
    rounds: int,
    steps: int,
    processes: int = 2,
    keys: int = 100,
    clients: int = 100,
    journal: str = "wal",
) -> dict[str, Any]:
    """Interleaved rounds of both implementations; the summary the JSON holds."""
    rates: dict[str, list[int]] = {i: [] for i in IMPLEMENTATIONS}
    p50: dict[str, dict[str, list[float]]] = {i: {op: [] for op in OPERATIONS} for i in rates}
    p99: dict[str, dict[str, list[float]]] = {i: {op: [] for op in OPERATIONS} for i in rates}
    for r in range(rounds):
        order = IMPLEMENTATIONS if r % 2 == 0 else tuple(reversed(IMPLEMENTATIONS))
        for implementation in order:
            got = one_round(implementation, processes, steps, keys, clients, journal)
            rates[implementation].append(got["steps_per_s"])
            for op, values in got["latencies_ns"].items():
                p50[implementation][op].append(percentile(values, 0.50) / 1000)
                p99[implementation][op].append(percentile(values, 0.99) / 1000)
            print(
                f"round {r + 1} {implementation}: {got['steps_per_s']:,} steps/s, p50 us "
                + ", ".join(f"{op} {p50[implementation][op][-1]:.1f}" for op in OPERATIONS),
                flush=True,
            )

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    summary = {
        i: {
            "steps_per_s": round(statistics.median(rates[i])),
            "p50_us": {op: med(p50[i][op]) for op in OPERATIONS},
            "p99_us": {op: med(p99[i][op]) for op in OPERATIONS},
        }
        for i in IMPLEMENTATIONS
    }
    return {
        "benchmark": "hostshare",
        "description": (
            "gateway/runtime/hostshare.py against stdlib sqlite3, both on /dev/shm, from "
            f"{processes} processes at once; a step is hit_window + take_share + give_share"
        ),
        "directory": shm_directory() or tempfile.gettempdir(),
        "sqlite_version": sqlite3.sqlite_version,
        "sqlite_journal_mode": journal,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_at_end": round(os.getloadavg()[0], 2),
        "processes": processes,
        "steps_per_process": steps,
        "keys": keys,
        "clients": clients,
        "rounds": rounds,
        "steps_per_s_by_round": rates,
        "summary": summary,
        # How many times hostshare's steps/s sqlite3's is: the margin the table is kept by.
        "hostshare_over_sqlite3": round(
            summary["hostshare"]["steps_per_s"] / summary["sqlite3"]["steps_per_s"], 2
        ),
        "hostshare_over_sqlite3_by_round": [
            round(h / s, 2) for h, s in zip(rates["hostshare"], rates["sqlite3"], strict=True)
        ],
    }


def report(result: dict[str, Any]) -> str:
    """The summary as a Markdown table and the margin."""
    lines = [
        "| implementation | steps/s, all processes | "
        + " | ".join(f"{op} p50 / p99 us" for op in OPERATIONS)
        + " |",
        "|---|---|" + "---|" * len(OPERATIONS),
    ]
    for name, s in result["summary"].items():
        cells = " | ".join(f"{s['p50_us'][op]} / {s['p99_us'][op]}" for op in OPERATIONS)
        lines.append(f"| {name} | {s['steps_per_s']:,} | {cells} |")
    lines.append(
        f"hostshare / sqlite3, steps/s: {result['hostshare_over_sqlite3']}x "
        f"(rounds {result['hostshare_over_sqlite3_by_round']})"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20000, help="steps per process and round")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--journal", default="wal", help="SQLite journal_mode (wal, memory, ...)")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args(argv)
    provenance()  # the commit and date as the run starts
    result = run(args.rounds, args.steps, args.processes, journal=args.journal)
    print(report(result))
    if not args.no_write:
        print(write_results("hostshare", result))
        print(
            bar_plot(
                "hostshare",
                f"Host table steps/s, {args.processes} processes at once (higher is better)",
                list(IMPLEMENTATIONS),
                [result["summary"][i]["steps_per_s"] for i in IMPLEMENTATIONS],
                "steps per second (hit_window + take + give)",
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
