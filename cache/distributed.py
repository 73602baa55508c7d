"""Cross-replica single flight: N gateways sharing one Redis synthesize each master once.

The in-process :class:`cache.singleflight.SingleFlight` makes one task per key in a process; this
makes one *replica* per key do the work. How, and what a lock value holds: docs/scale-out.md,
"Cross-replica single flight", and docs/security.md, "Locks". Beyond those pages: between polls a
waiter tries the lock again, so a holder that failed (lock released, no value) is taken over too;
clocks must agree to two thirds of ``lock_ttl_s`` because a live lock always has that much left;
and a replica whose clock is behind honours a replayed lock value that much longer.

Polling rather than pub/sub: a waiter needs the value, which lives in the store anyway, and a
subscription costs a dedicated connection per waiter (per cluster shard); the poll is at most
``poll_max_s`` late. Any Redis failure degrades to local work (counted), never to a failed request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TypeVar

from cache.entry import CorruptEntry, Entry
from cache.redis_tier import RedisTier
from cache.tier import Tier, TierError
from metrics import Metrics

log = logging.getLogger("voxgate.cache.distributed")

T = TypeVar("T")


@dataclass(eq=False)
class CrossReplicaFlight:
    """Produce each key once across every replica that shares ``tier``'s Redis."""

    tier: RedisTier
    _: KW_ONLY
    lock_ttl_s: float = 30.0
    max_wait_s: float = 60.0
    poll_min_s: float = 0.02
    poll_max_s: float = 0.25
    metrics: Metrics | None = None

    def __post_init__(self) -> None:
        self.lock_ttl_s = max(0.001, self.lock_ttl_s)

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
        lock = _Lock(self.lock_key(key))
        try:
            acquired = await self._acquire(lock)
        except TierError:  # Redis down or breaker open: this replica works alone (counted)
            self._count_lock("bypassed")
            return await produce()
        if acquired:
            self._count_lock("acquired")
            return await self._hold(lock, produce)
        self._count_lock("contended")
        return await self._wait(key, lock, produce, adopt)

    def _token(self, lock: _Lock) -> str:
        """A fresh value for ``lock``: minted at each attempt, so its expiry runs from when it
        is written (a waiter that takes the lock after a long wait writes a full-length one)."""
        return self.tier.seal.lock_token(lock.name, self.lock_ttl_s)

    async def _acquire(self, lock: _Lock) -> bool:
        token = self._token(lock)
        client = self.tier.client
        ttl_ms = self._ttl_ms()
        got = await self.tier.guarded(
            "lock", lambda: client.set(lock.name, token, nx=True, px=ttl_ms)
        )
        if got:
            lock.token = token
        return bool(got)

    def _ttl_ms(self) -> int:
        return max(1, int(self.lock_ttl_s * 1000))

    async def _hold(self, lock: _Lock, produce: Callable[[], Awaitable[T]]) -> T:
        # The keeper lives exactly as long as the work: a TaskGroup cancels it and waits for it
        # on every way out, and lets the caller's own cancellation through (where
        # suppress(CancelledError) around awaiting the cancelled keeper swallowed it).
        # The keeper is also told by an event: a cancellation is delivered once, and a library
        # below it that turned that one into an error or a result would leave the keeper renewing
        # forever and this TaskGroup waiting on it (a holder's test hung so once in a suite run);
        # the event ends it at its next tick, whatever became of the cancellation.
        failure: BaseException | None = None
        done = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as scope:
                keeper = scope.create_task(self._keep(lock, done), name="redis-lock-keeper")
                try:
                    return await produce()
                finally:
                    done.set()
                    keeper.cancel()
        except BaseExceptionGroup as group:
            # The keeper never raises, so the group holds produce's one error: raised as itself
            # below (outside this handler, so its own context stays as it was), as callers expect.
            failure = group.exceptions[0]
        finally:
            await self._release(lock)
        raise failure

    async def _keep(self, lock: _Lock, done: asyncio.Event) -> None:
        """Renew the lock every third of its TTL until ``done`` is set, with a fresh value (a
        new expiry under the tag); never raises (a keeper failure must not fail or cancel the
        work: the lock then just expires)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.lock_ttl_s / 3):
                    await done.wait()
            if done.is_set():
                return
            token = self._token(lock)
            try:
                renewed = await self.tier.guarded(
                    "lock", functools.partial(self._renew, lock.name, lock.token, token)
                )
            except TierError as exc:
                # Counted by guarded; the next tick tries again, and if Redis stays away the
                # lock expires and another replica may duplicate the work: safe, only wasteful.
                # (Redis may have applied the renewal and lost the answer: then the lock holds
                # a value we no longer know, and expires on its own.)
                log.debug("lock renewal failed: %s", exc)
                continue
            except Exception:
                log.exception("the lock keeper failed; the lock will expire on its own")
                return
            if not renewed:
                log.warning("synthesis lock lost before the work finished: %s", lock.name)
                return
            lock.token = token

    async def _renew(self, name: str, held: str, token: str) -> bool:
        """Replace lock value ``held`` with ``token`` and a full TTL; False when ``name`` no
        longer holds ``held`` (the lock expired, and another replica may have it)."""
        renewed = await self.tier.client.eval(_RENEW_IF_EQUAL, 1, name, held, token, self._ttl_ms())
        return bool(renewed)

    async def _release(self, lock: _Lock) -> None:
        client = self.tier.client
        held = lock.token
        try:
            released = await self.tier.guarded(
                "unlock", lambda: client.eval(_DELETE_IF_EQUAL, 1, lock.name, held)
            )
        except TierError as exc:
            # Counted by guarded; the lock expires on its own within its TTL.
            log.debug("lock release failed: %s", exc)
            return
        if not released:
            log.debug("lock %s expired before release (another replica may hold it)", lock.name)

    async def _wait(
        self,
        key: str,
        lock: _Lock,
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
                entry = await self._stored(key)
                if entry is not None:
                    outcome = "result"
                    return await adopt(entry)
                if loop.time() - started >= self.max_wait_s:
                    outcome = "timeout"
                    log.warning(
                        "waited %.1fs on another replica; synthesizing here", self.max_wait_s
                    )
                    break
                if await self._acquire(lock) or await self._evict_squatter(lock):
                    # The holder may have stored its entry and released the lock between this
                    # poll's read and the acquire: read once more under the lock, so a finished
                    # production is adopted rather than made again.
                    entry = await self._stored(key)
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

    async def _stored(self, key: str) -> Entry | None:
        try:
            return await self.tier.get(key)
        except CorruptEntry:
            return None  # the holder's put will overwrite it, or a takeover will

    async def _evict_squatter(self, lock: _Lock) -> bool:
        """True when the lock was no live replica's (see the module) and this call has it."""
        name = lock.name
        client = self.tier.client

        async def look() -> list[object]:
            pipe = client.pipeline(transaction=False)
            pipe.get(name)
            pipe.pttl(name)
            return list(await pipe.execute())

        value, pttl = await self.tier.guarded("lock", look)
        if not isinstance(value, bytes):
            return False  # released since (the next poll finds the value, or takes the lock)
        if self._held_by_a_replica(name, value, pttl):
            return False  # another replica's: wait for it
        self._count_lock("squatted")
        log.warning("a synthesis lock no live replica holds was found and removed: %s", name)
        await self.tier.guarded(
            "lock",
            lambda: client.eval(_DELETE_IF_EQUAL, 1, name, value),
        )
        return await self._acquire(lock)

    def _held_by_a_replica(self, name: str, value: bytes, pttl: object) -> bool:
        """Whether a lock value and its TTL are what a live holder keeps (see the module)."""
        if not isinstance(pttl, int) or not 0 < pttl <= self._ttl_ms():
            return False
        expires = self.tier.seal.lock_token_expiry(name, value)
        return expires is not None and expires > time.time()

    def _count_lock(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.redis_locks.labels(result).inc()

    def _observe_wait(self, outcome: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.redis_lock_waits.labels(outcome).inc()
            self.metrics.redis_lock_wait_seconds.observe(seconds)


@dataclass(slots=True)
class _Lock:
    """One attempt's lock: its Redis key and the value this call wrote there last (empty until
    it holds the lock; replaced at each renewal)."""

    name: str
    token: str = ""


# Deletes a key only if it still holds the value read: a replica that took the lock between the
# look and the delete keeps it, as does a holder whose renewal wrote a new value meanwhile.
_DELETE_IF_EQUAL = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)

# See CrossReplicaFlight._renew.
_RENEW_IF_EQUAL = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
)
