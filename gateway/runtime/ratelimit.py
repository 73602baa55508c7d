"""Per-key limits: ``requests_per_minute`` on every request of a key and
``chars_per_minute`` on the characters its misses send to synthesis.

How they are counted (the ``limits`` library's sliding-window counter: in Redis with
``redis_url``, else in the host's table, :mod:`gateway.runtime.hostshare`), what happens while
Redis is unreachable, and why counters are named by an HMAC and impossible ones deleted:
docs/security.md, "Limits per key". All storage calls are async or in memory: the event loop
never waits on a socket.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import time
from typing import Any
from urllib.parse import urlsplit

import redis
from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, RedisClusterStorage, RedisSentinelStorage
from limits.aio.storage import RedisStorage as LimitsRedisStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from limits.errors import StorageError
from redis.driver_info import DriverInfo
from redis.exceptions import RedisError

from gateway.errors import TooManyRequests
from gateway.runtime.apikeys import APIKey
from gateway.runtime.hostshare import HostTable
from gateway.speech.caller import caller
from metrics import Metrics, add_counts

log = logging.getLogger("voxgate.auth")

# Counter identities kept (key names of the keys file, over its reloads).
_MAX_IDENTITIES = 4096
# Each limit's item, made once: limits come from the keys file (a bounded set).
_per_minute = functools.cache(RateLimitItemPerMinute)


def limits_storage_uri(redis_url: str) -> tuple[type[LimitsRedisStorage], str, dict[str, Any]]:
    """The ``limits`` storage class, URI and options for one of voxgate's Redis URLs."""
    scheme, _, rest = redis_url.partition("://")
    scheme = scheme.lower()
    if scheme.endswith("+sentinel"):
        # voxgate's form is host:port[,host:port]/<service>/<db>; limits takes the service apart.
        parts = urlsplit(redis_url)
        service = next((s for s in parts.path.split("/") if s), None)
        options = {"service_name": service} if service else {}
        return RedisSentinelStorage, f"async+{scheme}://{parts.netloc}", options
    cls = RedisClusterStorage if scheme.endswith("+cluster") else LimitsRedisStorage
    return cls, f"async+{'redis+unix' if scheme == 'unix' else scheme}://{rest}", {}


def limits_storage(redis_url: str, key_prefix: str, timeout_s: float) -> LimitsRedisStorage:
    """A ``limits`` storage in the Redis of ``redis_url``, its keys under ``key_prefix``; nothing
    connects yet. Blocking: ``limits`` imports its Redis clients when the first one is made."""
    cls, uri, options = limits_storage_uri(redis_url)
    options.update(
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        # Given explicitly: left out, redis-py 8 reads its version from the package metadata
        # for every new connection, on the event loop (as cache/redis_tier.py notes).
        driver_info=DriverInfo(name="redis-py", lib_version=redis.__version__),
    )
    return cls(
        uri, wrap_exceptions=True, implementation="redispy", key_prefix=key_prefix, **options
    )


class KeyLimits:
    """Admits or refuses (429, ``TooManyRequests`` with Retry-After) a key's requests and
    characters; shared through Redis when one is configured."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        redis_url: str = "",
        secret: bytes = b"",
        prefix: str = "voxgate:",
        timeout_s: float = 0.5,
        retry_redis_after_s: float = 2.0,
    ) -> None:
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.retry_redis_after_s = retry_redis_after_s
        # The host's table, once the app has opened it; this process's counters before that
        # and for a key the table has no room for.
        self.host: HostTable | None = None
        self._local = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._shared: SlidingWindowCounterRateLimiter | None = None
        self._redis: LimitsRedisStorage | None = None
        self._redis_url = redis_url
        self._prefix = prefix
        self._secret = secret
        # The counter identity of each key name, per limit (requests, characters): an HMAC
        # computed once per name, not per request. Names come from the keys file (bounded).
        self._request_ids: dict[str, str] = {}
        self._char_ids: dict[str, str] = {}
        # Redis is skipped until this monotonic time after a failure (0: in use).
        self._redis_down_until = 0.0
        self._children: dict[tuple[str, ...], Any] = {}
        # Requests counted since the last flush, by (key, result): a Prometheus increment (a
        # lock) per request was a cost of every keyed hit. Added to the counter before every
        # collection and with the request tallies (gateway.http.observe, <= 0.1 s).
        self._counts: dict[tuple[str, ...], int] = {}
        metrics.before_collect(self.flush_counts)

    async def start(self) -> None:
        """Make the Redis storage when one is configured, in a thread (:func:`limits_storage`)."""
        if not self._redis_url or self._redis is not None:
            return
        storage = await asyncio.to_thread(
            limits_storage, self._redis_url, f"{self._prefix}ratelimit", self.timeout_s
        )
        self._redis = storage
        self._shared = SlidingWindowCounterRateLimiter(storage)

    async def close(self) -> None:
        """Close the Redis connections (at shutdown)."""
        # limits gives its storages no close; the redis-py client is its bridge's ``storage``.
        client = getattr(getattr(self._redis, "bridge", None), "storage", None)
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()

    def _identity(self, kind: str, name: str, known: dict[str, str]) -> str:
        """The counter identity of key ``name`` for limit ``kind`` ("r" or "c"): the name
        itself without a secret (counters in this process only), else an HMAC of it."""
        ident = known.get(name)
        if ident is None:
            if len(known) >= _MAX_IDENTITIES:  # names of keys since removed: start over
                known.clear()
            if self._secret:
                mac = hmac.new(self._secret, f"ratelimit\0{kind}\0{name}".encode(), hashlib.sha256)
                ident = f"{kind}:{mac.hexdigest()[:32]}"
            else:
                ident = f"{kind}:{name}"
            known[name] = ident
        return ident

    def count(self, key: str, result: str) -> None:
        """Count one request of ``key`` by result (ok, forbidden, rate_limited)."""
        k = (key, result)
        counts = self._counts
        counts[k] = counts.get(k, 0) + 1

    def flush_counts(self) -> None:
        """Add the requests counted since the last flush to the Prometheus counter."""
        counts, self._counts = self._counts, {}
        add_counts(self.metrics.api_key_requests, self._children, counts)

    async def _hit(self, item: RateLimitItem, identity: str, cost: int) -> tuple[bool, float]:
        """(admitted, seconds until it would be) for ``cost`` units of ``item`` under
        ``identity``: in Redis when configured and reachable, else in the host's table."""
        if self._shared is not None and time.monotonic() >= self._redis_down_until:
            limiter = self._shared
            try:
                async with asyncio.timeout(self.timeout_s * 2):
                    ok = await limiter.hit(item, identity, cost=cost)
                    if not ok and await self._discard_impossible(item, identity):
                        ok = await limiter.hit(item, identity, cost=cost)
                    retry = 0.0 if ok else await self._retry_after(limiter, item, identity)
                if self._redis_down_until:
                    self._redis_down_until = 0.0
                    log.info("rate limits: Redis reachable again; budgets are shared again")
                return ok, retry
            except (StorageError, RedisError, OSError, TimeoutError) as exc:
                if not self._redis_down_until:
                    log.warning(
                        "rate limits: Redis unreachable (%s); enforcing them per host until it "
                        "is back",
                        type(exc).__name__,
                    )
                self._redis_down_until = time.monotonic() + self.retry_redis_after_s
        if self._shared is not None:
            self.metrics.rate_limit_fallbacks.inc()
        if self.host is not None:
            got = self.host.hit_window(identity, item.amount, item.get_expiry(), cost, time.time())
            if got is not None:
                return got
            self.metrics.host_table_full.inc()
        ok = await self._local.hit(item, identity, cost=cost)
        return ok, 0.0 if ok else await self._retry_after(self._local, item, identity)

    async def _discard_impossible(self, item: RateLimitItem, identity: str) -> bool:
        """Delete ``identity``'s counters in Redis if no replica could have written them
        (docs/security.md, "Limits per key"); True when it did. The library's script never takes
        a count past the limit (it refuses first) and gives every counter a TTL of at most twice
        the window. Only a refusal pays for this read."""
        assert self._redis is not None
        name, expiry = item.key_for(identity), item.get_expiry()
        previous, previous_ttl, current, current_ttl = await self._redis.get_sliding_window(
            name, expiry
        )

        def possible(count: int, ttl: float) -> bool:
            return count <= item.amount and (count <= 0 or 0 < ttl <= 2 * expiry)

        if possible(previous, previous_ttl) and possible(current, current_ttl):
            return False
        self.metrics.rate_limit_counters_discarded.inc()
        log.warning("rate limits: a counter no replica could have written was deleted from Redis")
        await self._redis.clear_sliding_window(name, expiry)
        return True

    @staticmethod
    async def _retry_after(
        limiter: SlidingWindowCounterRateLimiter, item: RateLimitItem, identity: str
    ) -> float:
        stats = await limiter.get_window_stats(item, identity)
        return max(1.0, stats.reset_time - time.time())

    async def admit_request(self, key: APIKey) -> None:
        """Count one request of ``key`` against its ``requests_per_minute`` (429 beyond)."""
        identity = self._identity("r", key.name, self._request_ids)
        ok, retry = await self._hit(_per_minute(key.requests_per_minute), identity, 1)
        if not ok:
            self.count(key.name, "rate_limited")
            raise TooManyRequests(
                f"API key {key.name!r} is over its limit of {key.requests_per_minute} requests "
                "per minute",
                code="requests_per_minute",
                retry_after_s=retry,
            )

    async def admit_synthesis(self, chars: int) -> None:
        """Count ``chars`` characters sent to synthesis against the calling key's
        ``chars_per_minute`` (429 beyond); no key (keys off, a signed URL, the CLI): nothing."""
        key = caller().key
        if key is None:
            return
        self.metrics.api_key_chars.labels(key.name).inc(chars)
        if not key.chars_per_minute:
            return
        if chars > key.chars_per_minute:
            raise TooManyRequests(
                f"this sentence has {chars} characters; API key {key.name!r} may send "
                f"{key.chars_per_minute} per minute to synthesis: send shorter sentences",
                code="chars_per_minute",
            )
        identity = self._identity("c", key.name, self._char_ids)
        ok, retry = await self._hit(_per_minute(key.chars_per_minute), identity, chars)
        if not ok:
            self.metrics.api_key_chars_limited.labels(key.name).inc()
            raise TooManyRequests(
                f"API key {key.name!r} is over its limit of {key.chars_per_minute} characters "
                "per minute sent to synthesis",
                code="chars_per_minute",
                retry_after_s=retry,
            )
