"""Sentinel failover: the master dies, Sentinel promotes its replica, and the tier follows it
without a restart (docs/scale-out.md: "a failover is an outage of a few seconds for the
breaker, not a restart")."""

from __future__ import annotations

import asyncio
import functools
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bench.harness import redis_server
from cache.entry import Entry
from cache.redis_tier import RedisTier
from cache.tier import TierError, TierUnavailable
from metrics import Metrics
from tests.redis_support import SentinelServer
from tests.support import SECRET

KEY = "f" * 64


def replica_synced(port: int, key: str) -> bool:
    cli = shutil.which("redis-cli") or "redis-cli"
    out = subprocess.run(
        [cli, "-p", str(port), "exists", key], capture_output=True, text=True, timeout=5
    ).stdout
    return out.strip() == "1"


@pytest.mark.slow
async def test_tier_follows_a_sentinel_failover_without_a_restart(tmp_path: Path) -> None:
    with (
        redis_server(tmp_path / "master") as master,
        redis_server(
            tmp_path / "replica", extra=["--replicaof", "127.0.0.1", str(master.port)]
        ) as replica,
    ):
        sentinel = SentinelServer(tmp_path / "sentinel", master.port)
        await asyncio.to_thread(sentinel.start)
        try:
            metrics = Metrics()
            tier = await asyncio.to_thread(
                functools.partial(
                    RedisTier.from_url,
                    f"redis+sentinel://127.0.0.1:{sentinel.port}/{sentinel.service}/0",
                    secret=SECRET,
                    metrics=metrics,
                    # Calls to the dead master are refused at once; 0.5 s failed the first put
                    # (which asks Sentinel for the master, then connects) on a loaded machine.
                    timeout_s=5.0,
                    breaker_failures=2,
                    breaker_reset_s=0.5,
                )
            )
            entry = Entry.create(
                b"RIFF" + b"\x01" * 4000, content_type="audio/wav", fmt="wav", sample_rate=16000
            )
            await tier.put(KEY, entry)
            name = tier.entry_key(KEY)
            # (The replica's first sync waits out the master's repl-diskless-sync-delay, 5 s.)
            deadline = time.monotonic() + 60
            while not await asyncio.to_thread(replica_synced, replica.port, name):
                assert time.monotonic() < deadline, "the replica never got the entry"
                await asyncio.sleep(0.1)

            assert master.proc is not None
            master.proc.kill()  # the master dies; Sentinel notices after 1 s and promotes
            await asyncio.to_thread(master.proc.wait, 10)
            failures = 0
            started = time.monotonic()
            while True:
                t0 = time.monotonic()
                try:
                    got = await tier.get(KEY)
                except (TierError, TierUnavailable):
                    failures += 1  # a counted miss while there is no master
                    got = None
                # No call may hang past the operation timeout (plus reconnect slack).
                assert time.monotonic() - t0 < 10.0
                if got is not None:
                    break
                assert time.monotonic() - started < 30, "the tier never reached the new master"
                await asyncio.sleep(0.2)
            assert got.audio == entry.audio
            assert failures > 0  # the outage was seen, and survived
            print(f"failover outage: {time.monotonic() - started:.1f} s, {failures} misses")
            # The promoted replica takes writes: the tier is fully back.
            await tier.put("e" * 64, entry)
            assert await tier.get("e" * 64) is not None
            await tier.close()
        finally:
            await asyncio.to_thread(sentinel.stop)
