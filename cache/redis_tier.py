"""The shared tier: Redis (single node, Sentinel-fronted, or Cluster) on ``redis.asyncio``.

One key per entry holds the whole blob (metadata + audio, :meth:`Entry.to_blob`, framed with a
CRC-32), so a lookup is one GET, one round trip. Keys are ``<prefix>e:<content key>``: they carry the content address only,
never the text. Unpinned entries get a TTL; pinned entries get none, and with the eviction policy
``volatile-lru`` (or ``volatile-lfu``/``volatile-ttl``) Redis only ever evicts keys that have a
TTL, so pinned entries are never evicted.

Every command is bounded by a per-operation timeout and goes through a :class:`CircuitBreaker`:
an error or timeout raises :class:`TierError` (the store counts a miss), and while the breaker is
open the tier is skipped at once (:class:`TierUnavailable`).

URLs: ``redis://``, ``rediss://`` (TLS), ``unix://`` with optional ``user:password@``; a
``redis+cluster://`` (or ``rediss+cluster://``) URL selects Redis Cluster via
:class:`redis.asyncio.cluster.RedisCluster` (any node of the cluster as the seed); a
``redis+sentinel://h1:26379,h2:26379/<service>/<db>`` URL asks Sentinel for the master.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
from crc32c import crc32c
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import RedisError

from cache.breaker import BreakerState, CircuitBreaker
from cache.entry import CorruptEntry, Entry, read_meta
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

# A Redis value is a frame: magic, CRC of the blob, then the blob (Entry.to_blob). The CRC
# guards the whole blob (metadata and audio) on every read; a mismatch is a corrupt entry: a miss
# plus a delete. VXR2 frames carry a CRC-32C (hardware, ~10 us per 250 KB); VXR1 frames, written
# by earlier versions, a zlib CRC-32 (~65 us), and are still read.
_FRAME = struct.Struct(">4sI")
_MAGIC = b"VXR2"
_MAGIC_V1 = b"VXR1"
_MAGICS = (_MAGIC, _MAGIC_V1)


def frame(blob: bytes) -> bytes:
    """The Redis value holding ``blob``."""
    return _FRAME.pack(_MAGIC, crc32c(blob)) + blob


def unframe(value: bytes | memoryview) -> Entry:
    """The entry in a Redis value; :class:`CorruptEntry` when the frame or its CRC is wrong."""
    if len(value) < _FRAME.size:
        raise CorruptEntry("redis value too short")
    magic, crc = _FRAME.unpack_from(value, 0)
    if magic not in _MAGICS:
        raise CorruptEntry("not a voxgate redis value")
    blob = memoryview(value)[_FRAME.size :]  # no copy: from_blob copies the audio once
    if (crc32c(blob) if magic == _MAGIC else zlib.crc32(blob)) != crc:
        raise CorruptEntry("crc mismatch")
    return Entry.from_blob(blob, verify=False)


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
    kwargs = dict(common)
    kwargs["db"] = int(parts[1]) if len(parts) > 1 else 0
    if parsed.username:
        kwargs["username"] = unquote(parsed.username)
    if parsed.password:
        kwargs["password"] = unquote(parsed.password)
    ssl = parsed.scheme.lower().startswith("rediss")
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels,
        sentinel_kwargs={k: v for k, v in common.items() if k.startswith("socket_")},
        ssl=ssl,
        **kwargs,
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
        prefix: str = "voxgate:",
        ttl_s: int = 7 * 24 * 3600,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY,
        timeout_s: float = 0.5,
        breaker: CircuitBreaker | None = None,
        metrics: Metrics | None = None,
        reader: RespReader | None = None,
    ) -> None:
        self.client = client
        # GETs of entries go through the lean reader when there is one (cache/resp.py says why).
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
        """Connect to ``url`` (lazily: the first command opens the connection).

        With ``lean_reads`` (the default) entry GETs on a ``redis://`` or ``unix://`` URL go
        through :class:`~cache.resp.RespReader`; everything else, and every other URL, through
        redis-py.
        """
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

    # ---- the guarded call ----------------------------------------------------------------------

    async def guarded(
        self, op: str, call: Callable[[], Awaitable[T]], *, timeout_s: float | None = None
    ) -> T:
        """Run one Redis operation under the breaker and the per-operation timeout.

        Raises :class:`TierUnavailable` when the breaker is open and :class:`TierError` when the
        call fails or times out (counted in ``voxgate_redis_errors_total``).
        """
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

    # ---- Tier protocol -------------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        reader = self.reader
        if reader is not None:
            name = self.entry_key(key).encode()
            # unframe runs as the reply lands (a CorruptEntry it raises comes out of the call).
            return await self.guarded("get", lambda: self._lean_get(reader, name))
        blob = await self.guarded("get", lambda: self.client.get(self.entry_key(key)))
        if blob is None:
            return None
        if not isinstance(blob, bytes):
            raise CorruptEntry("unexpected value type")
        return unframe(blob)

    @staticmethod
    async def _lean_get(reader: RespReader, name: bytes) -> Entry | None:
        try:
            return await reader.get(name, unframe)
        except ReplyTooLarge as exc:
            # Never written by a gateway (put skips entries over the bound): a corrupt entry,
            # deleted like one, not a failing Redis.
            raise CorruptEntry("redis value over redis_max_entry_mb") from exc

    async def put(self, key: str, entry: Entry) -> None:
        blob = frame(entry.to_blob())
        if len(blob) > self.max_entry_bytes:
            self._skipped("put", "too_large")
            return
        # Pinned: SET without an expiry, which also clears a TTL the key had before.
        ttl_ms = None if entry.meta.pinned or self.ttl_s <= 0 else self.ttl_s * 1000
        await self.guarded("put", lambda: self.client.set(self.entry_key(key), blob, px=ttl_ms))

    async def delete(self, key: str) -> bool:
        n = await self.guarded("delete", lambda: self.client.delete(self.entry_key(key)))
        return bool(n)

    async def purge(self, match: PurgeFilter) -> int:
        """Remove matching entries: SCAN the prefix (never KEYS), read each entry's metadata head,
        delete the matches. Cost is O(entries under the prefix); it is an operator action.

        Works on a cluster: the cluster client scans every primary, and each read or delete is a
        single-key command routed to its slot's node.
        """
        removed = 0
        batch: list[str] = []
        pattern = f"{_glob_escape(self.prefix)}e:*"

        async def scan() -> None:
            async for raw in self.client.scan_iter(match=pattern, count=_SCAN_BATCH):
                batch.append(raw.decode() if isinstance(raw, bytes) else str(raw))

        # One bounded call for the whole scan: a purge is not a request, give it more time.
        await self.guarded("purge", scan, timeout_s=max(30.0, self.timeout_s))
        for start in range(0, len(batch), _SCAN_BATCH):
            removed += await self._purge_batch(batch[start : start + _SCAN_BATCH], match)
        return removed

    async def _purge_batch(self, names: list[str], match: PurgeFilter) -> int:
        async def heads() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.getrange(name, 0, _META_HEAD - 1)
            return list(await pipe.execute())

        doomed: list[str] = []
        for name, head in zip(names, await self.guarded("purge", heads), strict=True):
            if not head:
                continue  # expired or deleted since the scan
            try:
                if bytes(head[:4]) not in _MAGICS:
                    raise CorruptEntry("not a voxgate redis value")
                meta = read_meta(bytes(head[_FRAME.size :]))
            except CorruptEntry:
                doomed.append(name)  # unreadable: it could never be served anyway
                continue
            if match.matches(meta):
                doomed.append(name)
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
            if isinstance(self.client, RedisCluster):  # every primary, not one random node
                every = RedisCluster.PRIMARIES
                return (
                    await self.client.dbsize(target_nodes=every),
                    await self.client.info("memory", target_nodes=every),
                )
            return await self.client.dbsize(), await self.client.info("memory")

        size, info = await self.guarded("stats", both)
        if isinstance(size, dict):  # some cluster replies are per node
            size = sum(int(v) for v in size.values())
        used = _used_memory(info)
        return TierStats(self.name, int(size), used, None)

    async def ping(self) -> bool:
        """True when Redis answers now (for readiness reports)."""
        try:
            return bool(await self.guarded("ping", lambda: self.client.ping()))
        except TierError:
            return False

    async def close(self) -> None:
        if self.reader is not None:
            await self.reader.close()
        await self.client.aclose()

    def state(self) -> str:
        """The breaker state as a word: closed, half_open or open."""
        return BreakerState(self.breaker.state).name.lower()


def _used_memory(info: Any) -> int:
    if isinstance(info, dict) and "used_memory" in info:
        return int(info["used_memory"])
    if isinstance(info, dict):  # cluster: {node: {...}}
        return sum(int(v.get("used_memory", 0)) for v in info.values() if isinstance(v, dict))
    return 0


def _glob_escape(text: str) -> str:
    """Escape SCAN MATCH glob characters in a literal prefix."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
