"""The Redis tier, its breaker and the cross-replica lock, against a real single redis-server and a
real 3-master Redis Cluster on loopback."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bench.harness import RedisServer, free_port, redis_server
from cache.breaker import BreakerState, CircuitBreaker
from cache.distributed import CrossReplicaFlight
from cache.entry import CorruptEntry, Entry, ForgedEntry
from cache.redis_tier import RedisTier, is_cluster_url
from cache.tier import PurgeFilter, TierError, TierUnavailable
from metrics import Metrics
from tests.redis_support import SentinelServer, nothing_stored, redis_cluster
from tests.support import SECRET, until, wav_entry

# One pytest-xdist worker runs the whole module: its tests share the module-scoped Redis topologies.
pytestmark = pytest.mark.xdist_group("redis_tier")

KEY = "ab" * 32


# The joe voice's, unless a test names another (purges by voice tell them apart).
entry = functools.partial(wav_entry, voice="joe")


@pytest.fixture(scope="module", params=["single", "cluster", "sentinel"])
def redis_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real single node, a real 3-master cluster, a real node behind a real Sentinel (each
    started once per module)."""
    directory = tmp_path_factory.mktemp(f"redis-{request.param}")
    if request.param == "single":
        with redis_server(directory) as server:
            yield server.url
    elif request.param == "sentinel":
        with redis_server(directory / "master") as master:
            sentinel = SentinelServer(directory / "sentinel", master.port)
            sentinel.start()
            try:
                yield f"redis+sentinel://127.0.0.1:{sentinel.port}/{sentinel.service}/0"
            finally:
                sentinel.stop()
    else:
        with redis_cluster(directory) as cluster:
            yield cluster.url


async def make_tier(url: str, metrics: Metrics | None = None, **kw: object) -> RedisTier:
    # A fresh prefix per test keeps tests on the shared server apart. Built in a thread, as the
    # gateway does: the cluster client reads package metadata from disk when constructed. The
    # per-operation bound is 5 s unless a test sets its own: the default 0.5 s timed out a first
    # cluster connect in CI on a loaded 2-core machine (tests of the bound pass their own).
    kw.setdefault("timeout_s", 5.0)
    return await asyncio.to_thread(
        functools.partial(
            RedisTier.from_url,
            url,
            secret=SECRET,
            prefix=f"t{uuid.uuid4().hex[:8]}:",
            metrics=metrics or Metrics(),
            **kw,
        )  # type: ignore[arg-type]
    )


@pytest.fixture
async def tier(redis_url: str) -> AsyncIterator[RedisTier]:
    t = await make_tier(redis_url)
    yield t
    await t.close()


async def test_put_get_delete_round_trip(tier: RedisTier, redis_url: str) -> None:
    assert tier.is_cluster == is_cluster_url(redis_url)
    assert await tier.get(KEY) is None
    e = entry()
    await tier.put(KEY, e)
    got = await tier.get(KEY)
    assert got == e
    # One key per entry, named by the content address only; unpinned entries carry a TTL.
    names = [k async for k in tier.client.scan_iter(match=f"{tier.prefix}*")]
    assert names == [f"{tier.prefix}e:{KEY}".encode()]
    assert 0 < await tier.client.pttl(tier.entry_key(KEY)) <= tier.ttl_s * 1000
    assert await tier.delete(KEY)
    assert not await tier.delete(KEY)
    assert await tier.get(KEY) is None


async def test_pinned_entry_has_no_ttl(tier: RedisTier) -> None:
    await tier.put(KEY, entry())
    await tier.put(KEY, entry(pinned=True))  # pinning an existing entry clears its TTL
    assert await tier.client.pttl(tier.entry_key(KEY)) == -1
    got = await tier.get(KEY)
    assert got is not None and got.meta.pinned


async def test_corrupt_value_raises(tier: RedisTier) -> None:
    await tier.put(KEY, entry())
    value = bytearray(await tier.client.get(tier.entry_key(KEY)))
    value[-1] ^= 0xFF  # one flipped bit of audio
    await tier.client.set(tier.entry_key(KEY), bytes(value))
    with pytest.raises(CorruptEntry):
        await tier.get(KEY)
    await tier.client.set(tier.entry_key(KEY), entry().to_blob())  # not written by this tier
    with pytest.raises(CorruptEntry):
        await tier.get(KEY)


async def test_frames_written_by_earlier_versions_are_refused(tier: RedisTier) -> None:
    """VXR1/VXR2 frames carry a CRC only: anyone could have written them, so they are refused
    like a forgery (a miss; the store deletes them and the entry is made anew)."""
    import struct
    import zlib

    blob = entry().to_blob()
    legacy = struct.pack(">4sI", b"VXR1", zlib.crc32(blob)) + blob  # zlib CRC-32 frame
    await tier.client.set(tier.entry_key(KEY), legacy)
    with pytest.raises(ForgedEntry):
        await tier.get(KEY)


async def test_oversized_entry_is_skipped_and_counted(redis_url: str) -> None:
    metrics = Metrics()
    t = await make_tier(redis_url, metrics, max_entry_bytes=1000)
    try:
        await t.put(KEY, entry(b"x" * 5000))
        assert await t.get(KEY) is None
        assert metrics.redis_skipped.labels("put", "too_large")._value.get() == 1
    finally:
        await t.close()


async def test_purge_by_voice_and_model_without_keys(tier: RedisTier) -> None:
    keys_a = [f"{i:064x}" for i in range(30)]
    keys_b = [f"{i + 100:064x}" for i in range(20)]
    for k in keys_a:
        await tier.put(k, entry(voice="a"))
    for k in keys_b:
        await tier.put(k, entry(voice="b", pinned=True))
    assert await tier.purge(PurgeFilter(voice="a")) == 30
    assert all([await tier.get(k) is None for k in keys_a])
    assert all([await tier.get(k) is not None for k in keys_b])
    assert await tier.purge(PurgeFilter(model="other")) == 0
    assert await tier.purge(PurgeFilter(model="piper", pinned=False)) == 0
    assert await tier.purge(PurgeFilter(model="piper")) == 20


async def test_purge_reads_past_the_first_bytes_of_metadata_long_with_speech_marks(
    tier: RedisTier,
) -> None:
    """Speech marks make an entry's metadata longer than the purge's first read: that entry is
    judged by its metadata read whole, not deleted as unreadable."""
    marks = '{"time":0,"type":"word","start":0,"end":5,"value":"hello"}\n' * 400  # 24 KB
    kept, gone = f"{7:064x}", f"{8:064x}"
    for key, voice in ((kept, "b"), (gone, "a")):
        base = entry(voice=voice)
        marked = Entry.create(
            base.audio,
            content_type=base.meta.content_type,
            fmt=base.meta.format,
            sample_rate=base.meta.sample_rate,
            model=base.meta.model,
            voice=voice,
            marks=marks,
        )
        await tier.put(key, marked)
    assert await tier.purge(PurgeFilter(voice="a")) == 1
    assert await tier.get(gone) is None
    found = await tier.get(kept)
    assert found is not None and found.meta.marks == marks


# ---- cross-replica single flight ----------------------------------------------------------


async def test_two_replicas_produce_once(redis_url: str) -> None:
    """Two flights on two clients (two replicas): one produces, the other adopts its entry."""
    metrics_a, metrics_b = Metrics(), Metrics()
    a = await make_tier(redis_url, metrics_a)
    b = await asyncio.to_thread(
        functools.partial(
            RedisTier.from_url,
            redis_url,
            secret=SECRET,
            prefix=a.prefix,
            metrics=metrics_b,
            timeout_s=5.0,
        )
    )
    produced: list[str] = []

    def contended() -> float:
        return sum(m.redis_locks.labels("contended")._value.get() for m in (metrics_a, metrics_b))

    def producer(name: str, tier: RedisTier):  # type: ignore[no-untyped-def]
        async def produce() -> bytes:
            produced.append(name)
            # Until the other replica has found the lock held (a pause of 0.3 s let a replica
            # slow to reach Redis come after the release, and produce again, as it may).
            await until(lambda: contended() == 1, what="the other replica finding the lock held")
            e = entry(name.encode() * 10)
            await tier.put(KEY, e)
            return e.audio

        return produce

    async def adopt(e: Entry) -> bytes:
        return e.audio

    try:
        fa = CrossReplicaFlight(a, lock_ttl_s=5, max_wait_s=10, metrics=metrics_a)
        fb = CrossReplicaFlight(b, lock_ttl_s=5, max_wait_s=10, metrics=metrics_b)
        ra, rb = await asyncio.gather(
            fa.run(KEY, producer("a", a), adopt), fb.run(KEY, producer("b", b), adopt)
        )
        assert len(produced) == 1
        assert ra == rb == produced[0].encode() * 10
        waits = (
            metrics_a.redis_lock_waits.labels("result")._value.get()
            + metrics_b.redis_lock_waits.labels("result")._value.get()
        )
        assert waits == 1
        assert await a.client.exists(fa.lock_key(KEY)) == 0  # released after the work
    finally:
        await a.close()
        await b.close()


async def test_dead_holder_lock_expires_and_is_taken_over(tier: RedisTier) -> None:
    metrics = tier.metrics
    assert metrics is not None
    flight = CrossReplicaFlight(tier, lock_ttl_s=5, max_wait_s=10, metrics=metrics)
    # A replica that took the lock and died: nobody extends it, it expires after 2 s (at 400 ms
    # a loop stall of 400 ms before the flight asked let it find no lock, and take it at once).
    await tier.client.set(flight.lock_key(KEY), "dead-replica", px=2000)
    calls = 0

    async def produce() -> str:
        nonlocal calls
        calls += 1
        return "mine"

    assert await flight.run(KEY, produce, nothing_stored) == "mine"
    assert calls == 1
    assert metrics.redis_lock_waits.labels("takeover")._value.get() == 1


async def test_wait_is_bounded(tier: RedisTier) -> None:
    metrics = tier.metrics
    assert metrics is not None
    flight = CrossReplicaFlight(tier, lock_ttl_s=5, max_wait_s=0.4, metrics=metrics)
    # A replica's genuine lock (a valid token, a TTL within lock_ttl_s) that it never releases.
    stuck = tier.seal.lock_token(flight.lock_key(KEY), 5)
    await tier.client.set(flight.lock_key(KEY), stuck, px=5_000)

    async def produce() -> str:
        return "mine"

    assert await flight.run(KEY, produce, nothing_stored) == "mine"
    assert metrics.redis_lock_waits.labels("timeout")._value.get() == 1
    assert await tier.client.get(flight.lock_key(KEY)) == stuck.encode()  # not ours to delete


async def test_release_never_deletes_a_lock_it_lost(tier: RedisTier) -> None:
    flight = CrossReplicaFlight(tier, lock_ttl_s=5, max_wait_s=1)
    lock = flight.lock_key(KEY)

    async def produce() -> str:
        # Our lock expired and another replica took it while we worked.
        await tier.client.set(lock, "other-replica", px=60_000)
        return "mine"

    assert await flight.run(KEY, produce, nothing_stored) == "mine"
    assert await tier.client.get(lock) == b"other-replica"


async def test_lock_is_extended_while_the_work_runs(tier: RedisTier) -> None:
    """The keeper extends the lock every third of its TTL. A TTL of 1.5 s and work of 2.5 s: the
    lock outlives its TTL only if it was extended, and losing it needs the loop to stall a whole
    second between two extensions (0.2 s did it with the 0.3 s TTL this test used to have)."""
    flight = CrossReplicaFlight(tier, lock_ttl_s=1.5, max_wait_s=1)
    seen: list[bytes | None] = []

    async def produce() -> str:
        await asyncio.sleep(2.5)  # longer than the TTL: the keeper must extend it
        seen.append(await tier.client.get(flight.lock_key(KEY)))
        return "mine"

    assert await flight.run(KEY, produce, nothing_stored) == "mine"
    assert seen[0] is not None


async def test_a_failed_holder_raises_its_own_error_and_releases(tier: RedisTier) -> None:
    flight = CrossReplicaFlight(tier, lock_ttl_s=5, max_wait_s=1)

    async def produce() -> str:
        raise ValueError("the engine refused")

    # The keeper runs in a TaskGroup: the caller still sees the error itself, not a group.
    with pytest.raises(ValueError, match="the engine refused"):
        await flight.run(KEY, produce, nothing_stored)
    assert await tier.client.exists(flight.lock_key(KEY)) == 0


async def test_a_cancelled_holder_is_cancelled_and_releases(tier: RedisTier) -> None:
    flight = CrossReplicaFlight(tier, lock_ttl_s=5, max_wait_s=1)
    working = asyncio.Event()

    async def produce() -> str:
        working.set()
        await asyncio.Event().wait()  # until cancelled
        return "never"

    run = asyncio.create_task(flight.run(KEY, produce, nothing_stored))
    await working.wait()
    assert await tier.client.exists(flight.lock_key(KEY)) == 1
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert run.cancelled()
    assert await tier.client.exists(flight.lock_key(KEY)) == 0


# ---- outage and breaker -------------------------------------------------------------------


def test_breaker_opens_half_opens_and_closes() -> None:
    now = [0.0]
    states: list[BreakerState] = []
    b = CircuitBreaker(3, 2.0, clock=lambda: now[0], on_change=states.append)
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert b.state is BreakerState.CLOSED
    b.failure()
    assert b.state is BreakerState.OPEN and not b.allow()
    now[0] = 2.5
    assert b.allow()  # the probe
    assert not b.allow()  # one probe at a time
    b.failure()
    assert b.state is BreakerState.OPEN
    now[0] = 5.0
    assert b.allow()
    b.success()
    assert b.state is BreakerState.CLOSED and b.allow()
    assert states == [
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.CLOSED,
    ]


async def test_tier_survives_redis_outage_and_recovers_without_restart(tmp_path: Path) -> None:
    port = free_port()
    metrics = Metrics()
    t = RedisTier.from_url(
        f"redis://127.0.0.1:{port}/0",
        secret=SECRET,
        # The calls before the server starts are refused at once; the probe after it needs a
        # connection and a write, which 0.2 s did not always allow on a loaded machine.
        timeout_s=5,
        breaker_failures=2,
        # Long enough that the third call comes while the breaker is still open on any machine
        # (at 0.3 s a loop stall of 0.3 s made it the half-open probe instead).
        breaker_reset_s=2.0,
        metrics=metrics,
    )
    try:
        for _ in range(2):
            with pytest.raises(TierError):
                await t.get(KEY)
        with pytest.raises(TierUnavailable):  # open: skipped without asking Redis
            await t.get(KEY)
        assert metrics.redis_errors.labels("get")._value.get() == 2
        assert metrics.redis_skipped.labels("get", "breaker_open")._value.get() == 1
        assert metrics.cache_breaker_state.labels("redis")._value.get() == BreakerState.OPEN
        server = RedisServer(tmp_path / "r", port=port)
        server.start()
        try:
            await asyncio.sleep(2.05)  # time passes beyond the reset: the next call is the probe
            e = entry()
            await t.put(KEY, e)  # the half-open probe succeeds and closes the breaker
            assert await t.get(KEY) == e
            assert metrics.cache_breaker_state.labels("redis")._value.get() == BreakerState.CLOSED
        finally:
            server.stop()
    finally:
        await t.close()


def test_redis_settings_mask_the_url_and_reject_unknown_schemes() -> None:
    from gateway.runtime.settings import Settings, SettingsError

    s = Settings.load(
        env={
            "VOXGATE_REDIS_URL": "redis://user:s3cret@127.0.0.1:6379/0",
            "VOXGATE_CACHE_SECRET": SECRET.decode(),
        }
    )
    assert s.redis_url.get_secret_value().endswith("@127.0.0.1:6379/0")
    assert "s3cret" not in repr(s) and "s3cret" not in str(s.redis_url)
    assert s.shown()["redis_url"] == "****"
    with pytest.raises(SettingsError, match="redis_url"):
        Settings.load(env={}, overrides={"redis_url": "http://127.0.0.1:6379"})
    assert Settings.load(
        env={}, overrides={"redis_url": "redis+cluster://h:7000", "cache_secret": SECRET.decode()}
    ).redis_url


async def test_stats_count_keys_and_memory(tier: RedisTier) -> None:
    await tier.put(KEY, entry())
    stats = await tier.stats()
    assert stats.name == "redis"
    assert stats.entries >= 1
    assert stats.bytes > 0
