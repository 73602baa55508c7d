"""Cross-replica single flight: N gateways sharing one Redis synthesize each master once.

The in-process :class:`cache.singleflight.SingleFlight` makes one task per key in a process; this
makes one *replica* per key do the work:

1. redis-py's :class:`~redis.asyncio.lock.Lock` (``SET <prefix>lock:<key> <token> NX PX <ttl>``
   with a random token per attempt): the replica that gets the lock produces the value (and
   writes it to the store, Redis included). A keeper task extends the lock while the work runs,
   so a slow synthesis never loses it; a holder that dies stops extending and the lock expires
   after ``lock_ttl_s``.
2. Extend and release are redis-py's compare-token scripts: only the holder extends or deletes
   the lock, so a lock that expired and was taken by another replica is never released by us.
3. Other replicas poll the store key with exponential backoff. Between polls they try the lock
   again: a holder that died (lock expired) or failed (lock released, no value) is taken over.
4. A waiter gives up after ``max_wait_s`` and produces the value itself rather than hang.
5. A lock value is a nonce plus its HMAC under the cache secret, and a lock always has a TTL of
   at most ``lock_ttl_s``. A waiter that finds a lock value that does not verify, or a lock with
   no TTL or a longer one, knows no replica took it (someone wrote it to Redis): it deletes it
   (only if unchanged) and takes the lock, so a squatted key delays a miss by one poll, not by
   ``max_wait_s``.

Polling rather than pub/sub: a waiter needs the value, which lives in the store anyway, and a
subscription costs a dedicated connection per waiter (per cluster shard); the poll is at most
``poll_max_s`` late. Any Redis failure degrades to local work (counted), never to a failed request.

Lock and data keys are single keys used one at a time (the lock's scripts touch one key), so every
command is valid in Cluster mode.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis.asyncio.lock import Lock
from redis.exceptions import LockNotOwnedError

from cache.entry import CorruptEntry, Entry
from cache.redis_tier import RedisTier
from cache.tier import Tier, TierError
from metrics import Metrics

log = logging.getLogger("voxgate.cache.distributed")

T = TypeVar("T")


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
        self.lock_ttl_s = max(0.001, lock_ttl_s)
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
        # thread_local=False: the token belongs to this call, and every await of it runs on the
        # loop's thread anyway. The token is ours (an authenticated nonce), not redis-py's uuid1.
        name = self.lock_key(key)
        lock = Lock(self.tier.client, name, timeout=self.lock_ttl_s, thread_local=False)
        token = self.tier.seal.lock_token(name)
        try:
            acquired = await self._acquire(lock, token)
        except TierError:  # Redis down or breaker open: this replica works alone (counted)
            self._count_lock("bypassed")
            return await produce()
        if acquired:
            self._count_lock("acquired")
            return await self._hold(lock, produce)
        self._count_lock("contended")
        return await self._wait(key, lock, token, produce, adopt)

    async def _acquire(self, lock: Lock, token: str) -> bool:
        got = await self.tier.guarded("lock", lambda: lock.acquire(blocking=False, token=token))
        return bool(got)

    async def _hold(self, lock: Lock, produce: Callable[[], Awaitable[T]]) -> T:
        # The keeper lives exactly as long as the work: a TaskGroup cancels it and waits for it
        # on every way out, and lets the caller's own cancellation through (where
        # suppress(CancelledError) around awaiting the cancelled keeper swallowed it).
        failure: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as scope:
                keeper = scope.create_task(self._keep(lock), name="redis-lock-keeper")
                try:
                    return await produce()
                finally:
                    keeper.cancel()
        except BaseExceptionGroup as group:
            # The keeper never raises, so the group holds produce's one error: raised as itself
            # below (outside this handler, so its own context stays as it was), as callers expect.
            failure = group.exceptions[0]
        finally:
            await self._release(lock)
        raise failure

    async def _keep(self, lock: Lock) -> None:
        """Extend the lock every third of its TTL while the work runs; never raises (a keeper
        failure must not fail or cancel the work: the lock then just expires)."""
        while True:
            await asyncio.sleep(self.lock_ttl_s / 3)
            try:
                held = await self.tier.guarded("lock", lambda: _extend(lock, self.lock_ttl_s))
            except TierError as exc:
                # Counted by guarded; the next tick tries again, and if Redis stays away the
                # lock expires and another replica may duplicate the work: safe, only wasteful.
                log.debug("lock extend failed: %s", exc)
                continue
            except Exception:
                log.exception("the lock keeper failed; the lock will expire on its own")
                return
            if not held:
                log.warning("synthesis lock lost before the work finished: %s", lock.name)
                return

    async def _release(self, lock: Lock) -> None:
        try:
            await self.tier.guarded("unlock", lambda: _release_if_held(lock))
        except TierError as exc:
            # Counted by guarded; the lock expires on its own within its TTL.
            log.debug("lock release failed: %s", exc)

    async def _wait(
        self,
        key: str,
        lock: Lock,
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
                if await self._acquire(lock, token) or await self._evict_squatter(lock, token):
                    # The holder may have stored its entry and released the lock between this
                    # poll's read and the acquire: read once more under the lock, so a finished
                    # production is adopted rather than made again.
                    try:
                        entry = await self.tier.get(key)
                    except CorruptEntry:
                        entry = None
                    if entry is not None:
                        await self._release(lock)
                        outcome = "result"
                        return await adopt(entry)
                    outcome = "takeover"
                    self._observe_wait(outcome, loop.time() - started)
                    return await self._hold(lock, produce)
        except TierError as exc:
            outcome = "error"
            log.warning(
                "redis failed while waiting on another replica (%s); synthesizing here", exc
            )
        finally:
            if outcome != "takeover":
                self._observe_wait(outcome, loop.time() - started)
        return await produce()

    async def _evict_squatter(self, lock: Lock, token: str) -> bool:
        """True when the lock held was not a replica's (see the module's point 5) and this call
        now holds it instead."""
        name = str(lock.name)
        client = self.tier.client

        async def look() -> list[object]:
            pipe = client.pipeline(transaction=False)
            pipe.get(name)
            pipe.pttl(name)
            return list(await pipe.execute())

        value, pttl = await self.tier.guarded("lock", look)
        if not isinstance(value, bytes):
            return False  # released since (the next poll finds the value, or takes the lock)
        ttl_ok = isinstance(pttl, int) and 0 < pttl <= self.lock_ttl_s * 1000
        if ttl_ok and self.tier.seal.lock_token_valid(name, value):
            return False  # another replica's: wait for it
        self._count_lock("squatted")
        log.warning("a synthesis lock no replica took was found and removed: %s", name)
        await self.tier.guarded(
            "lock",
            lambda: client.eval(_DELETE_IF_EQUAL, 1, name, value),
        )
        return await self._acquire(lock, token)

    def _count_lock(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.redis_locks.labels(result).inc()

    def _observe_wait(self, outcome: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.redis_lock_waits.labels(outcome).inc()
            self.metrics.redis_lock_wait_seconds.observe(seconds)


# Deletes a key only if it still holds the value read: a replica that took the lock between the
# look and the delete keeps it.
_DELETE_IF_EQUAL = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)

# Losing the lock is an answer from Redis, not a Redis failure: these keep redis-py's
# LockNotOwnedError (a RedisError) away from the tier's breaker and error count.


async def _extend(lock: Lock, ttl_s: float) -> bool:
    """Reset ``lock``'s TTL to ``ttl_s`` if we still hold it; False when we lost it."""
    try:
        await lock.extend(ttl_s, replace_ttl=True)
    except LockNotOwnedError:
        return False
    return True


async def _release_if_held(lock: Lock) -> None:
    """Delete ``lock`` if it still holds our token; a lock another replica took is left alone."""
    try:
        await lock.release()
    except LockNotOwnedError:
        log.debug("lock %s expired before release (another replica may hold it)", lock.name)
