"""Purge by voice across every tier; pinned entries survive TTL and eviction."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.harness import RedisServer, redis_server
from cache.disk import DiskTier
from cache.entry import Entry
from cache.memory import MemoryTier
from cache.redis_tier import RedisTier
from cache.store import TieredStore
from cache.tier import PurgeFilter
from metrics import Metrics
from tests.support import SECRET, wav_entry


def entry(n: int, *, voice: str, pinned: bool = False, size: int = 1000) -> Entry:
    """Entry ``n``: its audio is ``n`` repeated to ``size`` bytes."""
    return wav_entry(n.to_bytes(4, "big") * (size // 4), voice=voice, pinned=pinned)


def key(n: int) -> str:
    return f"{n:064x}"


async def test_purge_by_voice_removes_exactly_that_voice_from_all_tiers(
    tmp_path: Path, redis: RedisServer
) -> None:
    metrics = Metrics()
    disk = await asyncio.to_thread(DiskTier, tmp_path / "disk", 50 * 2**20)  # touches the disk
    tiers = [
        MemoryTier(10 * 2**20),
        disk,
        RedisTier.from_url(redis.url, secret=SECRET, metrics=metrics, timeout_s=5.0),
    ]
    store = TieredStore(tiers, metrics)
    try:
        for n in range(12):
            await store.put(
                key(n), entry(n, voice="amy" if n % 3 == 0 else "joe", pinned=n % 4 == 0)
            )
        removed = await store.purge(PurgeFilter(voice="amy"))
        assert removed == {"memory": 4, "disk": 4, "redis": 4}
        for tier in tiers:
            for n in range(12):
                got = await tier.get(key(n))
                if n % 3 == 0:
                    assert got is None, (tier.name, n)
                else:
                    assert got is not None and got.meta.voice == "joe", (tier.name, n)
    finally:
        await store.close()


async def test_pinned_entries_survive_ttl_expiry(redis: RedisServer) -> None:
    tier = RedisTier.from_url(redis.url, secret=SECRET, ttl_s=1, timeout_s=5.0)
    try:
        await tier.put(key(1), entry(1, voice="joe"))
        await tier.put(key(2), entry(2, voice="joe", pinned=True))
        await asyncio.sleep(1.3)
        assert await tier.get(key(1)) is None
        got = await tier.get(key(2))
        assert got is not None and got.meta.pinned
    finally:
        await tier.close()


async def test_pinned_entries_survive_eviction_pressure(tmp_path: Path) -> None:
    """With maxmemory and volatile-lru (the documented policy) Redis evicts only TTL'd keys."""
    with redis_server(
        tmp_path / "r", extra=["--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru"]
    ) as server:
        tier = RedisTier.from_url(server.url, secret=SECRET, timeout_s=5.0)
        try:
            pinned = [key(n) for n in range(10)]
            for n, k in enumerate(pinned):
                await tier.put(k, entry(n, voice="joe", pinned=True, size=50_000))
            # 400 x 50 KB = 20 MB of unpinned entries through a 4 MB Redis.
            for n in range(100, 500):
                await tier.put(key(n), entry(n, voice="joe", size=50_000))
            info = await tier.client.info("stats")
            assert int(info["evicted_keys"]) > 0  # there was pressure
            for k in pinned:
                got = await tier.get(k)
                assert got is not None and got.meta.pinned
            survivors = [await tier.get(key(n)) for n in range(100, 500)]
            assert sum(1 for s in survivors if s is None) > 300
        finally:
            await tier.close()
