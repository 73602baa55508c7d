"""Cross-replica single flight: N gateways sharing one Redis synthesize each master once.

The in-process :class:`cache.singleflight.SingleFlight` makes one task per key in a process; this
makes one *replica* per key do the work:

1. ``SET <prefix>lock:<key> <token> NX PX <ttl>``: the replica that gets the lock produces the
   value (and writes it to the store, Redis included). A keeper task extends the lock while the
   work runs, so a slow synthesis never loses it; a holder that dies stops extending and the lock
   expires after ``lock_ttl_s``.
2. The lock is released by a compare-and-delete script, so a holder can only delete its own lock.
3. Other replicas poll the store key with exponential backoff. Between polls they try the lock
   again: a holder that died (lock expired) or failed (lock released, no value) is taken over.
4. A waiter gives up after ``max_wait_s`` and produces the value itself rather than hang.

Polling rather than pub/sub: a waiter needs the value, which lives in the store anyway, and a
subscription costs a dedicated connection per waiter (per cluster shard); the poll is at most
``poll_max_s`` late. Any Redis failure degrades to local work (counted), never to a failed request.

Lock and data keys are single keys used one at a time, so every command is valid in Cluster mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from cache.entry import CorruptEntry, Entry
from cache.redis_tier import RedisTier
from cache.tier import Tier, TierError
from metrics import Metrics

log = logging.getLogger("voxgate.cache.distributed")

T = TypeVar("T")

# KEYS[1] = lock, ARGV[1] = token: delete the lock only if we still hold it.
UNLOCK = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# KEYS[1] = lock, ARGV[1] = token, ARGV[2] = ttl ms: extend the lock only if we still hold it.
EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""


class CrossReplicaFlight:
    """Produce each key once across every replica that shares ``tier``'s Redis."""

    def __init__(
        self,
        tier: RedisTier,
        *,
        lock_ttl_s: float = 30.0,
        max_wait_s: float = 60.0,
        poll_min_s: float = 0.02,
        poll_max_s: float = 0.25,
        metrics: Metrics | None = None,
    ) -> None:
        self.tier = tier
        self.lock_ttl_ms = max(1, int(lock_ttl_s * 1000))
        self.max_wait_s = max_wait_s
        self.poll_min_s = poll_min_s
        self.poll_max_s = poll_max_s
        self.metrics = metrics

    @classmethod
    def for_tiers(cls, tiers: Sequence[Tier], **kw: object) -> CrossReplicaFlight | None:
        """A flight over the Redis tier among ``tiers``; None when there is none."""
        for tier in tiers:
            if isinstance(tier, RedisTier):
                return cls(tier, **kw)  # type: ignore[arg-type]
        return None

    def lock_key(self, key: str) -> str:
        """The Redis key of ``key``'s lock (content address only)."""
        return f"{self.tier.prefix}lock:{key}"

    async def run(
        self,
        key: str,
        produce: Callable[[], Awaitable[T]],
        adopt: Callable[[Entry], Awaitable[T]],
    ) -> T:
        """The value of ``key``: made here by ``produce`` if this replica gets the lock, else
        ``adopt``-ed from the entry another replica stores under ``key`` in the Redis tier.
        """
        lock, token = self.lock_key(key), secrets.token_hex(16)
        try:
            acquired = await self._acquire(lock, token)
        except TierError:  # Redis down or breaker open: this replica works alone (counted)
            self._count_lock("bypassed")
            return await produce()
        if acquired:
            self._count_lock("acquired")
            return await self._hold(lock, token, produce)
        self._count_lock("contended")
        return await self._wait(key, lock, token, produce, adopt)

    async def _acquire(self, lock: str, token: str) -> bool:
        client = self.tier.client
        got = await self.tier.guarded(
            "lock", lambda: client.set(lock, token, nx=True, px=self.lock_ttl_ms)
        )
        return bool(got)

    async def _hold(self, lock: str, token: str, produce: Callable[[], Awaitable[T]]) -> T:
        keeper = asyncio.create_task(self._keep(lock, token), name="redis-lock-keeper")
        try:
            return await produce()
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await self._release(lock, token)

    async def _keep(self, lock: str, token: str) -> None:
        """Extend the lock every third of its TTL while the work runs."""
        client = self.tier.client
        while True:
            await asyncio.sleep(self.lock_ttl_ms / 3000)
            try:
                held = await self.tier.guarded(
                    "lock", lambda: client.eval(EXTEND, 1, lock, token, self.lock_ttl_ms)
                )
            except TierError as exc:
                # Counted by guarded; the next tick tries again, and if Redis stays away the
                # lock expires and another replica may duplicate the work: safe, only wasteful.
                log.debug("lock extend failed: %s", exc)
                continue
            if not held:
                log.warning("synthesis lock lost before the work finished: %s", lock)
                return

    async def _release(self, lock: str, token: str) -> None:
        client = self.tier.client
        try:
            await self.tier.guarded("unlock", lambda: client.eval(UNLOCK, 1, lock, token))
        except TierError as exc:
            # Counted by guarded; the lock expires on its own within its TTL.
            log.debug("lock release failed: %s", exc)

    async def _wait(
        self,
        key: str,
        lock: str,
        token: str,
        produce: Callable[[], Awaitable[T]],
        adopt: Callable[[Entry], Awaitable[T]],
    ) -> T:
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay = self.poll_min_s
        outcome = "cancelled"
        try:
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.poll_max_s)
                try:
                    entry = await self.tier.get(key)
                except CorruptEntry:
                    entry = None  # the holder's put will overwrite it, or a takeover will
                if entry is not None:
                    outcome = "result"
                    return await adopt(entry)
                if loop.time() - started >= self.max_wait_s:
                    outcome = "timeout"
                    log.warning(
                        "waited %.1fs on another replica; synthesizing here", self.max_wait_s
                    )
                    break
                if await self._acquire(lock, token):
                    outcome = "takeover"
                    self._observe_wait(outcome, loop.time() - started)
                    return await self._hold(lock, token, produce)
        except TierError as exc:
            outcome = "error"
            log.warning(
                "redis failed while waiting on another replica (%s); synthesizing here", exc
            )
        finally:
            if outcome != "takeover":
                self._observe_wait(outcome, loop.time() - started)
        return await produce()

    def _count_lock(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.redis_locks.labels(result).inc()

    def _observe_wait(self, outcome: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.redis_lock_waits.labels(outcome).inc()
            self.metrics.redis_lock_wait_seconds.observe(seconds)
