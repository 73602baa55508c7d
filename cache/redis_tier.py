"""The shared tier: Redis (single node, Sentinel-fronted, or Cluster) on ``redis.asyncio``.

One key per entry holds the whole blob (metadata + audio, :meth:`Entry.to_blob`, framed with an
HMAC-SHA256 tag under the cache secret: :class:`EntrySeal`), so a lookup is one GET, one round
trip. Keys are ``<prefix>e:<content key>``: they carry the content address only, never the text.

Every command is bounded by a per-operation timeout and goes through a :class:`CircuitBreaker`
(:meth:`RedisTier.guarded`). Why pinned entries get no TTL, what an outage costs and the URL forms
(:func:`connect`): docs/scale-out.md, "Memory, eviction and pinning", "When Redis goes away" and
"Running N replicas".
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import RedisError

from cache.breaker import BreakerState, CircuitBreaker
from cache.entry import (
    MAX_META_BYTES,
    CorruptEntry,
    Entry,
    ForgedEntry,
    HeadTooShort,
    read_meta,
)
from cache.resp import ReplyTooLarge, RespReader
from cache.tier import PurgeFilter, TierError, TierStats, TierUnavailable, bounded
from metrics import Metrics

log = logging.getLogger("voxgate.cache.redis")

T = TypeVar("T")
RedisClient = Redis | RedisCluster

# The largest value written to (and read from) Redis unless set (redis_max_entry_mb).
DEFAULT_MAX_ENTRY = 16 * 1024 * 1024
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")

# A Redis value is a frame: magic, an HMAC-SHA256 tag, then the blob (Entry.to_blob). The tag is
# over the Redis key and the whole blob (metadata and audio) under the cache secret, so whoever can
# write to Redis but has not the secret cannot plant a value, nor move one to another key, and a
# flipped bit anywhere is caught too: either way a miss plus a delete, never served. It costs
# more CPU than the CRC-32C it replaces, but a replica reads a key from Redis once and then serves
# it from its memory tier (a Redis-tier hit, HMAC included: docs/bench/handmade_resp.json).
# VXR1/VXR2 frames (CRC only, written before the tag) are refused like a forgery: anyone could
# have written them.
_MAGIC = b"VXR3"
_TAG = 32
_HEAD = len(_MAGIC) + _TAG
_UNAUTHENTICATED = (b"VXR1", b"VXR2")
_MAGICS = (_MAGIC, *_UNAUTHENTICATED)


class EntrySeal:
    """Frames and checks Redis values under the cache secret (see above)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the cache secret must be at least 16 bytes")
        self._secret = secret

    def tag(self, name: bytes, blob: bytes | memoryview) -> bytes:
        """The HMAC-SHA256 of ``blob`` stored under Redis key ``name``."""
        mac = hmac.new(self._secret, len(name).to_bytes(2, "big") + name, hashlib.sha256)
        mac.update(blob)
        return mac.digest()

    def frame(self, name: bytes, blob: bytes) -> bytes:
        """The Redis value holding ``blob`` under key ``name``."""
        return _MAGIC + self.tag(name, blob) + blob

    def unframe(self, name: bytes, value: bytes | memoryview) -> Entry:
        """The entry in a Redis value stored under ``name``: :class:`ForgedEntry` when its tag
        does not verify, :class:`CorruptEntry` when it is no frame or its metadata is bad."""
        magic = bytes(value[:4])
        if magic in _UNAUTHENTICATED:
            raise ForgedEntry("a redis value without an authentication tag")
        if magic != _MAGIC or len(value) < _HEAD:
            raise CorruptEntry("not a voxgate redis value")
        blob = memoryview(value)[_HEAD:]  # no copy: from_blob copies the audio once
        if not hmac.compare_digest(self.tag(name, blob), bytes(value[4:_HEAD])):
            raise ForgedEntry("redis value fails authentication")
        return Entry.from_blob(blob, verify=False)

    def lock_token(self, name: str, ttl_s: float) -> str:
        """A fresh lock value for lock key ``name``, good for ``ttl_s`` seconds from now (by
        the wall clock: replicas on other hosts read it): a nonce, the expiry in Unix
        milliseconds and their tag, so a waiter can tell a lock a replica holds now from a key
        someone planted (no valid tag) or replayed (a captured value past its expiry)."""
        nonce = secrets.token_hex(16)
        expires_ms = str(int((time.time() + ttl_s) * 1000))
        return f"{nonce}.{expires_ms}.{self._lock_tag(name, nonce, expires_ms)}"

    def lock_token_expiry(self, name: str, value: bytes | str) -> float | None:
        """When ``value``, a lock value :meth:`lock_token` made for ``name``, expires (Unix
        seconds); None when it is not one (planted, altered, another key's, another secret's)."""
        # Bytes throughout: compare_digest refuses a str with non-ASCII characters, and a
        # planted value may hold any bytes.
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
        parts = raw.split(b".")
        if len(parts) != 3:
            return None
        nonce, expires_ms, tag = parts
        # Exactly what lock_token writes (bytes.isdigit is ASCII digits only): a planted "1e3",
        # " 12" or a 5,000-digit number never reaches int().
        if len(nonce) != 32 or not nonce.isascii():
            return None
        if not expires_ms.isdigit() or len(expires_ms) > 15:
            return None
        expected = self._lock_tag(name, nonce.decode(), expires_ms.decode()).encode()
        if not hmac.compare_digest(tag, expected):
            return None
        return int(expires_ms) / 1000

    def _lock_tag(self, name: str, nonce: str, expires_ms: str) -> str:
        return hmac.new(
            self._secret, f"lock\0{name}\0{nonce}\0{expires_ms}".encode(), hashlib.sha256
        ).hexdigest()[:32]


# Enough of a blob to hold its metadata (a few hundred bytes of JSON) when a purge scans entries.
_META_HEAD = 8192
_SCAN_BATCH = 256


def _sentinel_master(url: str, common: dict[str, Any]) -> Redis:
    """The master of a Sentinel-monitored service, from
    ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``.

    The credentials are the data nodes' (sentinels are asked without auth). The client asks the
    sentinels for the master on connect and again after a connection error, so a failover is an
    outage of a few seconds for the breaker, not a restart.
    """
    parsed = urlsplit(url)
    hosts = parsed.netloc.rpartition("@")[2]
    sentinels = []
    for hostport in hosts.split(","):
        host, _, port = hostport.rpartition(":")
        sentinels.append((host or hostport, int(port or 26379)))
    parts = [unquote(x) for x in parsed.path.split("/") if x]
    if not parts:
        raise ValueError("redis+sentinel:// URL needs a service name: .../<service>[/<db>]")
    sentinel = Sentinel(
        sentinels,
        sentinel_kwargs={k: v for k, v in common.items() if k.startswith("socket_")},
        ssl=parsed.scheme.lower().startswith("rediss"),
        db=int(parts[1]) if len(parts) > 1 else 0,
        username=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password else None,
        **common,
    )
    master: Redis = sentinel.master_for(parts[0], retry=Retry(NoBackoff(), 1))
    return master


def is_cluster_url(url: str) -> bool:
    """True for ``redis+cluster://`` and ``rediss+cluster://`` URLs."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def connect(url: str, *, timeout_s: float) -> RedisClient:
    """A client for ``url``: a plain client, or a cluster client for a ``+cluster`` scheme.

    redis-py's own retries are cut to one immediate retry (a pooled connection that a restarted
    Redis closed is replaced at once); longer outages are the circuit breaker's job, so a request
    never waits through a retry ladder.
    """
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "health_check_interval": 30,
        # Audio values are hundreds of KB: read them in few, large chunks.
        "socket_read_size": 1 << 20,
        # Given explicitly: left out, redis-py 8 looks its own version up in the installed
        # package metadata (a scan of site-packages) for *every new connection*, on the event
        # loop; 100 concurrent misses then stalled a gateway for seconds and timed Redis out.
        "driver_info": DriverInfo(name="redis-py", lib_version=redis.__version__),
    }
    scheme, sep, rest = url.partition("://")
    if scheme.lower() in SENTINEL_SCHEMES:
        return _sentinel_master(url, common)
    if scheme.lower() in CLUSTER_SCHEMES:
        return RedisCluster.from_url(
            f"{CLUSTER_SCHEMES[scheme.lower()]}{sep}{rest}",
            retry=Retry(NoBackoff(), 1),
            **common,
        )
    return Redis.from_url(url, retry=Retry(NoBackoff(), 1), **common)


class RedisTier:
    """The Redis tier. Construct with a client (see :func:`connect`) or with :meth:`from_url`."""

    name = "redis"

    def __init__(
        self,
        client: RedisClient,
        *,
        secret: bytes,
        prefix: str = "voxgate:",
        ttl_s: int = 7 * 24 * 3600,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY,
        timeout_s: float = 0.5,
        breaker: CircuitBreaker | None = None,
        metrics: Metrics | None = None,
        reader: RespReader | None = None,
    ) -> None:
        self.client = client
        self.seal = EntrySeal(secret)
        self.reader = reader
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.max_entry_bytes = max_entry_bytes
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        if metrics is not None:
            gauge = metrics.cache_breaker_state.labels(self.name)
            gauge.set(int(self.breaker.state))
            self.breaker.on_change = lambda state: gauge.set(int(state))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout_s: float = 0.5,
        breaker_failures: int = 5,
        breaker_reset_s: float = 2.0,
        lean_reads: bool = True,
        **kw: Any,
    ) -> RedisTier:
        """Connect to ``url`` (lazily); with ``lean_reads``, entry GETs on a ``redis://`` or
        ``unix://`` URL go through :class:`~cache.resp.RespReader`, all else through redis-py."""
        return cls(
            connect(url, timeout_s=timeout_s),
            timeout_s=timeout_s,
            breaker=CircuitBreaker(breaker_failures, breaker_reset_s),
            # A GET cancelled by the timeout (not sooner) drops the lean reader's connection.
            # (A value over the largest entry is refused before the reader allocates for it.)
            reader=RespReader.for_url(
                url,
                stall_s=0.9 * timeout_s,
                max_bulk=int(kw.get("max_entry_bytes", DEFAULT_MAX_ENTRY)),
            )
            if lean_reads
            else None,
            **kw,
        )

    @property
    def is_cluster(self) -> bool:
        """True when talking to a Redis Cluster."""
        return isinstance(self.client, RedisCluster)

    def entry_key(self, key: str) -> str:
        """The Redis key of content key ``key``."""
        return f"{self.prefix}e:{key}"

    async def guarded(
        self, op: str, call: Callable[[], Awaitable[T]], *, timeout_s: float | None = None
    ) -> T:
        """Run one Redis operation under the breaker and the per-operation timeout (see the
        module); a failure is counted in ``voxgate_redis_errors_total``."""
        if not self.breaker.allow():
            self._skipped(op, "breaker_open")
            raise TierUnavailable("redis tier skipped: circuit breaker open")
        try:
            result = await bounded(call(), timeout_s or self.timeout_s)
        except CorruptEntry:
            # Redis answered; the value was bad (the lean reader checks it as it lands). That is
            # the store's business (a miss and a delete), and for the breaker a success.
            self.breaker.success()
            raise
        except (RedisError, OSError, TimeoutError) as exc:
            self.breaker.failure()
            if self.metrics is not None:
                self.metrics.redis_errors.labels(op).inc()
            raise TierError(f"redis {op}: {type(exc).__name__}: {exc}") from exc
        self.breaker.success()
        return result

    def _skipped(self, op: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.redis_skipped.labels(op, reason).inc()

    async def get(self, key: str) -> Entry | None:
        reader = self.reader
        name = self.entry_key(key).encode()

        def unframe(value: bytes | memoryview) -> Entry:
            return self.seal.unframe(name, value)

        async def lean_get(reader: RespReader) -> Entry | None:
            try:
                return await reader.get(name, unframe)
            except ReplyTooLarge as exc:
                # Never written by a gateway (put skips entries over the bound): a corrupt
                # entry, deleted like one, not a failing Redis.
                raise CorruptEntry("redis value over redis_max_entry_mb") from exc

        if reader is not None:
            # unframe runs as the reply lands (a CorruptEntry it raises comes out of the call);
            # a reply declaring more than max_entry_bytes is refused before a buffer is made.
            return await self.guarded("get", lambda: lean_get(reader))
        blob = await self.guarded("get", lambda: self.client.get(name))
        if blob is None:
            return None
        if not isinstance(blob, bytes):
            raise CorruptEntry("unexpected value type")
        if len(blob) > self.max_entry_bytes:
            # redis-py has read it already (it cannot be told a bound); it is still not served.
            raise CorruptEntry("redis value larger than redis_max_entry_mb")
        return unframe(blob)

    async def put(self, key: str, entry: Entry) -> None:
        name = self.entry_key(key)
        blob = self.seal.frame(name.encode(), entry.to_blob())
        if len(blob) > self.max_entry_bytes:
            self._skipped("put", "too_large")
            return
        # Pinned: SET without an expiry, which also clears a TTL the key had before.
        ttl_ms = None if entry.meta.pinned or self.ttl_s <= 0 else self.ttl_s * 1000
        await self.guarded("put", lambda: self.client.set(name, blob, px=ttl_ms))

    async def delete(self, key: str) -> bool:
        return bool(await self.guarded("delete", lambda: self.client.delete(self.entry_key(key))))

    async def purge(self, match: PurgeFilter) -> int:
        """Remove matching entries: SCAN the prefix (never KEYS), read each entry's metadata head,
        delete the matches. Cost is O(entries under the prefix); it is an operator action.

        Works on a cluster: the cluster client scans every primary, and each read or delete is a
        single-key command routed to its slot's node.
        """
        batch: list[str] = []
        pattern = f"{_glob_escape(self.prefix)}e:*"

        async def scan() -> None:
            async for raw in self.client.scan_iter(match=pattern, count=_SCAN_BATCH):
                batch.append(raw.decode() if isinstance(raw, bytes) else str(raw))

        # One bounded call for the whole scan: a purge is not a request, give it more time.
        await self.guarded("purge", scan, timeout_s=max(30.0, self.timeout_s))
        chunks = [batch[i : i + _SCAN_BATCH] for i in range(0, len(batch), _SCAN_BATCH)]
        return sum([await self._purge_batch(chunk, match) for chunk in chunks])

    @staticmethod
    def _judge(
        name: str,
        head: Any,
        match: PurgeFilter,
        doomed: list[str],
        longer: list[tuple[str, int]] | None,
    ) -> None:
        """Whether the value ``name`` (its first bytes ``head``) goes: added to ``doomed``; or
        to ``longer`` with the bytes its metadata needs, when ``head`` ends before it does."""
        if not head:
            return  # expired or deleted since the scan
        try:
            magic = bytes(head[:4])
            if magic not in _MAGICS:
                raise CorruptEntry("not a voxgate redis value")
            skip = _HEAD if magic == _MAGIC else 8
            # Unverified (the head only): it decides what to delete, never what is served.
            meta = read_meta(bytes(head[skip:]))
        except HeadTooShort as short:
            if longer is not None and short.needed <= MAX_META_BYTES:
                longer.append((name, skip + short.needed))
            else:
                doomed.append(name)  # metadata past any bound: never served either
            return
        except CorruptEntry:
            doomed.append(name)  # unreadable: it could never be served anyway
            return
        if match.matches(meta):
            doomed.append(name)

    async def _heads(self, spans: list[tuple[str, int]]) -> list[Any]:
        async def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for name, end in spans:
                pipe.getrange(name, 0, end - 1)
            return list(await pipe.execute())

        return await self.guarded("purge", read)

    async def _purge_batch(self, names: list[str], match: PurgeFilter) -> int:
        doomed: list[str] = []
        # Metadata longer than the first read (an entry with speech marks): read again, as far
        # as it says, once.
        longer: list[tuple[str, int]] = []
        heads = await self._heads([(name, _META_HEAD) for name in names])
        for name, head in zip(names, heads, strict=True):
            self._judge(name, head, match, doomed, longer)
        if longer:
            for (name, _), head in zip(longer, await self._heads(longer), strict=True):
                self._judge(name, head, match, doomed, None)
        if not doomed:
            return 0

        async def delete() -> int:
            pipe = self.client.pipeline(transaction=False)
            for name in doomed:
                pipe.delete(name)  # one key per command: valid across cluster slots
            return sum(int(n) for n in await pipe.execute())

        return await self.guarded("purge", delete)

    async def stats(self) -> TierStats:
        """Keys in the database (all of them: Redis may be shared) and its memory use.

        Cheap on purpose (DBSIZE + INFO memory): ``/metrics`` asks on every scrape.
        """

        async def both() -> tuple[Any, Any]:
            # On a cluster: every primary, not one random node.
            kw = {"target_nodes": RedisCluster.PRIMARIES} if self.is_cluster else {}
            return await self.client.dbsize(**kw), await self.client.info("memory", **kw)

        size, info = await self.guarded("stats", both)
        if isinstance(size, dict):  # some cluster replies are per node
            size = sum(int(v) for v in size.values())
        used = 0
        if isinstance(info, dict) and "used_memory" in info:
            used = int(info["used_memory"])
        elif isinstance(info, dict):  # cluster: {node: {...}}
            used = sum(int(v.get("used_memory", 0)) for v in info.values() if isinstance(v, dict))
        return TierStats(self.name, int(size), used, None)

    async def close(self) -> None:
        if self.reader is not None:
            await self.reader.close()
        await self.client.aclose()

    def state(self) -> str:
        """The breaker state as a word: closed, half_open or open."""
        return BreakerState(self.breaker.state).name.lower()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
