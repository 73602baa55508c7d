"""The pin registry: which content addresses are pinned, for whom, how many bytes, and the quota.

Pinned entries are never evicted (the memory tier keeps them, the disk tier's pinned side has no
eviction, Redis holds them without a TTL), so what may be pinned is bounded here. Every pin is
recorded once per content address (its bytes, its owner, and its voice, model and creation time
for purges), and a reservation that would take its owner past the per-owner quota, or everyone
past the total, is refused whole before anything is pinned (:class:`PinQuotaExceeded`). A content
address pinned already costs nothing more, whoever pins it again. The prompts' listing (their
text, id, voice, format: what an entry cannot tell) is kept here too, one label per content
address, newest last.

Two homes, one contract (:class:`PinRegistry`):

- :class:`HostPinRegistry`: an SQLite database in the cache directory, shared by every gateway
  process of the host (SQLite locks across processes; a reservation is one ``BEGIN IMMEDIATE``
  transaction). Every call runs in the registry's own thread: the event loop never waits on it.
- :class:`RedisPinRegistry`: hashes in the Redis tier, shared by every replica; a reservation is
  one Lua script (atomic in Redis). The keys share a hash tag, so it runs on Redis Cluster too.

Nothing read back is trusted before it is checked: docs/security.md, "Pinned entries and the
pin quota".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hmac
import json
import logging
import math
import os
import re
import sqlite3
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from crc32c import crc32c

from cache.disk import _private_dir
from cache.redis_tier import RedisTier
from cache.tier import PurgeFilter, TierError, bounded

log = logging.getLogger("voxgate.cache.pins")

T = TypeVar("T")

# Charged for each record on top of its entry's bytes: about what a record and its keys take in
# Redis or SQLite (a record is ~200 bytes of JSON and a 64-character key).
RECORD_BYTES = 512
# The largest label (JSON) a pin may carry, and the most characters of a prompt's text it keeps:
# a listing of LISTING_LIMIT labels stays within 32 MiB whatever was pinned.
LABEL_MAX_BYTES = 8 * 1024
LABEL_TEXT_CHARS = 1000
# Prompts GET /v1/prompts lists at most (the newest).
LISTING_LIMIT = 4096
# The owner of pins made without an API key (keys off, or the CLI): not a valid key name, so no
# key ever shares its budget.
ANONYMOUS = "(anonymous)"

_KEY = re.compile(r"[0-9a-f]{64}")
_OWNER_MAX = 128
_LABEL_VALUES = (str, int, float, bool, type(None))


class PinRegistryError(Exception):
    """The registry could not be read or written (disk or Redis failing): nothing was pinned."""


@dataclass(frozen=True)
class PinItem:
    """One content address to pin: its entry's size and what a purge selects it by."""

    key: str
    bytes: int
    voice: str = ""
    model: str = ""
    created: float = 0.0


@dataclass(frozen=True)
class PinQuota:
    """Most bytes pinned in all (``total``) and by one owner (``per_owner``; None: no bound)."""

    total: int
    per_owner: int | None = None


@dataclass(frozen=True)
class PinUsage:
    """Bytes pinned by each owner and in all."""

    owners: dict[str, int]

    @property
    def total(self) -> int:
        """Bytes pinned in all."""
        return sum(self.owners.values())


@dataclass(eq=False, repr=False)
class PinQuotaExceeded(Exception):
    """Pinning would take ``owner`` past its quota (``limit`` is ``"per_owner"``) or everyone
    past the total (``"total"``). Nothing was pinned."""

    owner: str
    limit: str
    needed: int
    owner_bytes: int
    total_bytes: int
    quota: PinQuota

    def __post_init__(self) -> None:
        super().__init__(f"pin quota exceeded ({self.limit})")


def check_room(
    owner: str, needed: int, owner_bytes: int, total_bytes: int, quota: PinQuota
) -> None:
    """Raise :class:`PinQuotaExceeded` unless ``needed`` more bytes fit ``owner``'s quota and
    the total (``needed`` 0 always fits: pinning what is pinned costs nothing)."""
    if needed <= 0:
        return
    if quota.per_owner is not None and owner_bytes + needed > quota.per_owner:
        raise PinQuotaExceeded(owner, "per_owner", needed, owner_bytes, total_bytes, quota)
    if total_bytes + needed > quota.total:
        raise PinQuotaExceeded(owner, "total", needed, owner_bytes, total_bytes, quota)


def encode_label(key: str, label: Mapping[str, object]) -> bytes:
    """A label as stored: compact JSON of a flat object (str keys, scalar values) naming ``key``;
    ValueError when it is not one or is over :data:`LABEL_MAX_BYTES`."""
    body = {**label, "key": key}
    if not all(isinstance(k, str) and isinstance(v, _LABEL_VALUES) for k, v in body.items()):
        raise ValueError("a pin label is a flat JSON object of scalars")
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    if len(data) > LABEL_MAX_BYTES:
        raise ValueError(f"a pin label is at most {LABEL_MAX_BYTES} bytes")
    return data


def decode_label(key: str, data: bytes | memoryview) -> dict[str, object]:
    """The label stored for ``key``; ValueError when it is not one :func:`encode_label` made."""
    if len(data) > LABEL_MAX_BYTES:
        raise ValueError("label too large")
    body = json.loads(bytes(data))
    if not isinstance(body, dict) or body.get("key") != key:
        raise ValueError("label of another key")
    for name, value in body.items():
        if not isinstance(value, _LABEL_VALUES) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise ValueError(f"label field {name!r} is not a scalar")
    return body


def _unique(items: Sequence[PinItem]) -> list[PinItem]:
    seen: dict[str, PinItem] = {}
    for item in items:
        if not _KEY.fullmatch(item.key) or item.bytes < 0:
            raise ValueError("a pin names a content address and a size")
        seen.setdefault(item.key, item)
    return list(seen.values())


class PinRegistry(Protocol):
    """Where pins are recorded and their quota checked (one host, or every replica)."""

    where: str

    async def reserve(
        self,
        owner: str,
        items: Sequence[PinItem],
        labels: Mapping[str, bytes],
        quota: PinQuota,
    ) -> int:
        """Record ``items`` for ``owner`` (those not recorded yet) and set ``labels`` (content
        address -> :func:`encode_label` bytes), all or nothing; the bytes newly charged.
        :class:`PinQuotaExceeded` when they do not fit ``quota``: then nothing is recorded."""
        ...

    async def usage(self) -> PinUsage: ...

    async def listing(self, limit: int = LISTING_LIMIT) -> list[dict[str, object]]:
        """The newest ``limit`` labels, oldest first."""
        ...

    async def forget(self, match: PurgeFilter) -> int:
        """Drop the records (and labels) of pins ``match`` purges; how many."""
        ...

    async def revisions(self) -> dict[tuple[str, str], str]:
        """The address revision of each (model, engine fingerprint) a rollout switched."""
        ...

    async def set_revision(self, model: str, fingerprint: str, revision: str) -> None:
        """Switch ``model`` served by an engine of ``fingerprint`` to ``revision``."""
        ...

    async def close(self) -> None: ...


def charge_of(item: PinItem, label: bytes | None) -> int:
    """What pinning ``item`` (with ``label``) is charged: its record and label too, so the
    registry's own size is within the quota."""
    return item.bytes + RECORD_BYTES + (len(label) if label is not None else 0)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pins (
    key TEXT PRIMARY KEY, owner TEXT NOT NULL, bytes INTEGER NOT NULL,
    voice TEXT NOT NULL, model TEXT NOT NULL, created REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS owners (owner TEXT PRIMARY KEY, bytes INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS labels (key TEXT PRIMARY KEY, at REAL NOT NULL, label BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS labels_by_time ON labels (at);
CREATE TABLE IF NOT EXISTS revisions (
    model TEXT NOT NULL, fingerprint TEXT NOT NULL, revision TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (model, fingerprint)
) WITHOUT ROWID;
"""
_REVISION_FIELD_MAX = 128


def check_revision(model: str, fingerprint: str, revision: str) -> None:
    """ValueError for a revision record that cannot be one (empty, too long, a newline)."""
    for value in (model, fingerprint, revision):
        if not value or len(value) > _REVISION_FIELD_MAX or "\n" in value:
            raise ValueError("a revision names a model, a fingerprint and a revision")


_CRC = struct.Struct(">I")


def _frame(data: bytes) -> bytes:
    return _CRC.pack(crc32c(data)) + data


def _unframe(blob: object) -> bytes:
    if not isinstance(blob, bytes) or len(blob) < _CRC.size:
        raise ValueError("not a framed label")
    (crc,) = _CRC.unpack_from(blob)
    data = blob[_CRC.size :]
    if crc32c(data) != crc:
        raise ValueError("label crc mismatch")
    return data


def _private_files(db: Path) -> None:
    """Make the database ``db`` (and its WAL and shared-memory files, if there) readable by this
    user only: they hold pinned texts and their addresses, whatever the cache directory's mode.

    SQLite gives the -wal and -shm files it creates the database file's mode, so the database is
    made 0600 before SQLite opens it; files left by an older version are narrowed too.
    """
    os.close(os.open(db, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)


class HostPinRegistry:
    """The registry of one host: ``pins.sqlite3`` in the cache directory (see the module)."""

    where = "host"

    def __init__(self, path: str | Path, *, timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        # One thread owns the connection: SQLite objects stay on the thread that made them.
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pins")
        self._db: sqlite3.Connection | None = None

    @classmethod
    def in_cache_dir(cls, cache_dir: str | Path) -> HostPinRegistry:
        """The registry every gateway process using ``cache_dir`` shares."""
        return cls(Path(cache_dir) / "pins.sqlite3")

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            _private_dir(self.path.parent)
            _private_files(self.path)
            # Autocommit; writes take BEGIN IMMEDIATE, so two processes' reservations are
            # serialized (the busy timeout waits for the other's lock).
            db = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await bounded(
                loop.run_in_executor(self._pool, functools.partial(fn, *args)),
                2 * self.timeout_s,
            )
        except (sqlite3.Error, OSError, TimeoutError) as exc:
            raise PinRegistryError(f"pin registry: {type(exc).__name__}: {exc}") from exc

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    @staticmethod
    def _owners(db: sqlite3.Connection) -> dict[str, int]:
        out: dict[str, int] = {}
        for owner, n in db.execute("SELECT owner, bytes FROM owners").fetchall():
            # Typed by SQLite's affinity only: a row of another shape is not counted.
            if isinstance(owner, str) and len(owner) <= _OWNER_MAX and type(n) is int and n > 0:
                out[owner] = n
        return out

    async def reserve(
        self,
        owner: str,
        items: Sequence[PinItem],
        labels: Mapping[str, bytes],
        quota: PinQuota,
    ) -> int:
        unique, labels = _unique(items), dict(labels)

        def reserve(db: sqlite3.Connection) -> int:
            fresh = [
                i
                for i in unique
                if db.execute("SELECT 1 FROM pins WHERE key = ?", (i.key,)).fetchone() is None
            ]
            charges = [charge_of(i, labels.get(i.key)) for i in fresh]
            needed = sum(charges)
            owners = self._owners(db)
            check_room(owner, needed, owners.get(owner, 0), sum(owners.values()), quota)
            db.executemany(
                "INSERT INTO pins VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (i.key, owner, c, i.voice, i.model, i.created)
                    for i, c in zip(fresh, charges, strict=True)
                ],
            )
            if needed:
                db.execute(
                    "INSERT INTO owners VALUES (?, ?) "
                    "ON CONFLICT (owner) DO UPDATE SET bytes = bytes + excluded.bytes",
                    (owner, needed),
                )
            now = time.time()
            db.executemany(
                "INSERT OR REPLACE INTO labels VALUES (?, ?, ?)",
                [(k, now + n * 1e-6, _frame(v)) for n, (k, v) in enumerate(labels.items())],
            )
            return needed

        return await self._run(self._write, reserve)

    async def usage(self) -> PinUsage:
        return await self._run(lambda: PinUsage(self._owners(self._conn())))

    def _listing_sync(self, limit: int) -> list[dict[str, object]]:
        db = self._conn()
        rows = db.execute(
            "SELECT key, label FROM labels ORDER BY at DESC LIMIT ?", (limit,)
        ).fetchall()
        out: list[dict[str, object]] = []
        bad: list[object] = []
        for key, blob in rows:
            try:
                if not isinstance(key, str):
                    raise ValueError("key is not text")
                out.append(decode_label(key, _unframe(blob)))
            except ValueError:
                bad.append(key)
        if bad:
            log.warning("pin registry: %d unreadable labels deleted", len(bad))
            self._write(
                lambda d: d.executemany("DELETE FROM labels WHERE key = ?", [(k,) for k in bad])
            )
        out.reverse()
        return out

    async def listing(self, limit: int = LISTING_LIMIT) -> list[dict[str, object]]:
        return await self._run(self._listing_sync, limit)

    async def forget(self, match: PurgeFilter) -> int:
        def forget(db: sqlite3.Connection) -> int:
            doomed: list[tuple[object, object, object]] = []
            for key, owner, n, voice, model, created in db.execute(
                "SELECT key, owner, bytes, voice, model, created FROM pins"
            ).fetchall():
                well_formed = (
                    isinstance(voice, str)
                    and isinstance(model, str)
                    and isinstance(created, (int, float))
                )
                # A row of another shape is dropped: it names nothing a gateway pinned.
                if not well_formed or match.selects(voice, model, float(created), True, key):
                    doomed.append((key, owner, n))
            keys = [(key,) for key, _, _ in doomed]
            db.executemany("DELETE FROM pins WHERE key = ?", keys)
            db.executemany("DELETE FROM labels WHERE key = ?", keys)
            charges = [(n, owner) for _, owner, n in doomed if type(n) is int]
            db.executemany("UPDATE owners SET bytes = bytes - ? WHERE owner = ?", charges)
            db.execute("DELETE FROM owners WHERE bytes <= 0")
            return len(doomed)

        return await self._run(self._write, forget)

    async def revisions(self) -> dict[tuple[str, str], str]:
        # Text only: a row of another type was not written by a gateway.
        sql = (
            "SELECT model, fingerprint, revision FROM revisions WHERE typeof(model) = 'text' "
            "AND typeof(fingerprint) = 'text' AND typeof(revision) = 'text'"
        )
        rows = await self._run(lambda: self._conn().execute(sql).fetchall())
        return {(model, fingerprint): revision for model, fingerprint, revision in rows}

    async def set_revision(self, model: str, fingerprint: str, revision: str) -> None:
        check_revision(model, fingerprint, revision)
        sql = "INSERT OR REPLACE INTO revisions (model, fingerprint, revision, at) VALUES (?,?,?,?)"
        row = (model, fingerprint, revision, time.time())
        await self._run(self._write, lambda db: db.execute(sql, row))

    def _close_sync(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._close_sync)
        await asyncio.to_thread(self._pool.shutdown, wait=True)


# KEYS: records, sums, labels, order. ARGV: owner, per-owner limit (-1: none), total limit, the
# number of items N, N x (key, charge, record), then (key, score, label) triplets to the end.
_RESERVE = """
local owner, olim, tlim, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local needed, fresh = 0, {}
for i = 0, n - 1 do
  local k = ARGV[5 + 3 * i]
  if redis.call('HEXISTS', KEYS[1], k) == 0 then
    needed = needed + tonumber(ARGV[6 + 3 * i])
    fresh[#fresh + 1] = i
  end
end
local have, total = 0, 0
local sums = redis.call('HGETALL', KEYS[2])
for j = 1, #sums, 2 do
  local v = tonumber(sums[j + 1]) or 0
  total = total + v
  if sums[j] == owner then have = v end
end
if needed > 0 and ((olim >= 0 and have + needed > olim) or total + needed > tlim) then
  return {0, needed, have, total}
end
for _, i in ipairs(fresh) do
  redis.call('HSET', KEYS[1], ARGV[5 + 3 * i], ARGV[7 + 3 * i])
end
if needed > 0 then redis.call('HINCRBY', KEYS[2], owner, needed) end
local m = 5 + 3 * n
while m + 2 <= #ARGV do
  redis.call('HSET', KEYS[3], ARGV[m], ARGV[m + 2])
  redis.call('ZADD', KEYS[4], ARGV[m + 1], ARGV[m])
  m = m + 3
end
return {1, needed, have, total}
"""

# KEYS as above. ARGV: (key, owner, charge, record) quadruplets: each record is dropped only if it
# is still the one read (a concurrent purge or pin changed nothing then), its charge given back
# to its owner (owner "" for a record that failed authentication: its numbers are not believed).
_FORGET = """
local dropped = 0
for m = 1, #ARGV, 4 do
  local k, owner, charge = ARGV[m], ARGV[m + 1], tonumber(ARGV[m + 2])
  if redis.call('HGET', KEYS[1], k) == ARGV[m + 3] then
    redis.call('HDEL', KEYS[1], k)
    redis.call('HDEL', KEYS[3], k)
    redis.call('ZREM', KEYS[4], k)
    if owner ~= '' and redis.call('HINCRBY', KEYS[2], owner, -charge) <= 0 then
      redis.call('HDEL', KEYS[2], owner)
    end
    dropped = dropped + 1
  end
end
return dropped
"""

_TAG = 32
# A reservation is one script; give it longer than a GET (thousands of items are possible).
_SCRIPT_TIMEOUT_S = 10.0
_SCAN_BATCH = 512


class RedisPinRegistry:
    """The registry every replica shares, in the Redis tier's database (see the module)."""

    where = "redis"

    def __init__(self, tier: RedisTier) -> None:
        self.tier = tier
        # One hash tag for all four keys: a script's keys must share a slot on Redis Cluster.
        base = f"{tier.prefix}{{pins}}:"
        self.records, self.sums = f"{base}rec", f"{base}sum"
        self.labels, self.order = f"{base}label", f"{base}order"
        self._keys = [self.records, self.sums, self.labels, self.order]
        self.revision_hash = f"{base}rev"
        self._reserve = tier.client.register_script(_RESERVE)
        self._forget = tier.client.register_script(_FORGET)

    def _seal(self, hash_key: str, field: str, data: bytes) -> bytes:
        return self.tier.seal.tag(f"{hash_key}\0{field}".encode(), data) + data

    def _open(self, hash_key: str, field: str, value: object) -> bytes:
        if not isinstance(value, bytes) or len(value) < _TAG:
            raise ValueError("not a sealed pin value")
        if not hmac.compare_digest(self._seal(hash_key, field, value[_TAG:]), value):
            raise ValueError("pin value fails authentication")
        return value[_TAG:]

    async def _call(self, fn: Callable[[], Any], timeout_s: float = _SCRIPT_TIMEOUT_S) -> Any:
        try:
            return await self.tier.guarded(
                "pins", fn, timeout_s=max(timeout_s, self.tier.timeout_s)
            )
        except TierError as exc:
            raise PinRegistryError(f"pin registry: {exc}") from exc

    async def reserve(
        self,
        owner: str,
        items: Sequence[PinItem],
        labels: Mapping[str, bytes],
        quota: PinQuota,
    ) -> int:
        unique = _unique(items)
        per_owner = -1 if quota.per_owner is None else quota.per_owner
        args: list[str | bytes | int | float] = [owner, per_owner, quota.total, len(unique)]
        for item in unique:
            charge = charge_of(item, labels.get(item.key))
            record = {
                "owner": owner,
                "bytes": charge,
                "voice": item.voice,
                "model": item.model,
                "created": item.created,
            }
            data = json.dumps(record, separators=(",", ":")).encode()
            args += [item.key, charge, self._seal(self.records, item.key, data)]
        now_ms = time.time() * 1000
        for n, (key, label) in enumerate(labels.items()):
            args += [key, now_ms + n * 1e-3, self._seal(self.labels, key, label)]
        reply = await self._call(lambda: self._reserve(keys=self._keys, args=args))
        ok, needed, have, total = (int(x) for x in reply)
        if not ok:
            check_room(owner, needed, have, total, quota)  # names the limit the script hit
            raise PinQuotaExceeded(owner, "total", needed, have, total, quota)
        return needed

    async def usage(self) -> PinUsage:
        raw = await self._call(lambda: self.tier.client.hgetall(self.sums), 0.0)
        owners: dict[str, int] = {}
        for name, value in dict(raw).items():
            owner = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            try:
                n = int(value)
            except (TypeError, ValueError):
                continue
            if n > 0 and len(owner) <= _OWNER_MAX:
                owners[owner] = n
        return PinUsage(owners)

    async def listing(self, limit: int = LISTING_LIMIT) -> list[dict[str, object]]:
        async def read() -> tuple[list[Any], list[Any]]:
            keys: list[Any] = list(await self.tier.client.zrevrange(self.order, 0, limit - 1))
            values = list(await self.tier.client.hmget(self.labels, keys)) if keys else []
            return keys, values

        keys, values = await self._call(read)
        out: list[dict[str, object]] = []
        bad: list[str] = []
        for raw, value in zip(keys, values, strict=True):
            key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            try:
                out.append(decode_label(key, self._open(self.labels, key, value)))
            except ValueError:
                bad.append(key)
        if bad:
            log.warning("pin registry: %d labels failing authentication deleted", len(bad))

            async def drop() -> None:
                pipe = self.tier.client.pipeline(transaction=False)
                pipe.hdel(self.labels, *bad)
                pipe.zrem(self.order, *bad)
                await pipe.execute()

            await self._call(drop)
        out.reverse()
        return out

    async def forget(self, match: PurgeFilter) -> int:
        if match.pinned is False:
            return 0
        rows: list[tuple[str, bytes]] = []

        async def scan() -> None:
            async for field, value in self.tier.client.hscan_iter(self.records, count=_SCAN_BATCH):
                key = field.decode(errors="replace") if isinstance(field, bytes) else str(field)
                rows.append((key, value if isinstance(value, bytes) else b""))

        await self._call(scan, 30.0)
        doomed: list[str | int | bytes] = []
        for key, value in rows:
            try:
                record = json.loads(self._open(self.records, key, value))
                owner, charge = str(record["owner"]), int(record["bytes"])
                voice, model = str(record["voice"]), str(record["model"])
                created = float(record["created"])
            except (ValueError, TypeError, KeyError):
                doomed += [key, "", 0, value]  # planted or altered: dropped, its numbers unused
                continue
            if match.selects(voice, model, created, True, key):
                doomed += [key, owner, charge, value]
        dropped = 0
        for start in range(0, len(doomed), 4 * _SCAN_BATCH):
            batch = doomed[start : start + 4 * _SCAN_BATCH]
            dropped += int(
                await self._call(lambda b=batch: self._forget(keys=self._keys, args=b))  # type: ignore[misc]
            )
        return dropped

    async def revisions(self) -> dict[tuple[str, str], str]:
        read = await self._call(lambda: self.tier.client.hgetall(self.revision_hash))
        out: dict[tuple[str, str], str] = {}
        for raw, value in dict(read).items():
            field = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            try:
                revision = self._open(self.revision_hash, field, value).decode()
            except (ValueError, UnicodeDecodeError):
                continue  # planted or altered: never applied
            model, _, fingerprint = field.partition("\n")
            out[(model, fingerprint)] = revision
        return out

    async def set_revision(self, model: str, fingerprint: str, revision: str) -> None:
        check_revision(model, fingerprint, revision)
        field = f"{model}\n{fingerprint}"
        value = self._seal(self.revision_hash, field, revision.encode())
        await self._call(lambda: self.tier.client.hset(self.revision_hash, field, value))

    async def close(self) -> None:
        """Nothing of its own: the client is the Redis tier's (closed with the store)."""


def registry_for(tiers: Sequence[object], cache_dir: str | Path) -> PinRegistry:
    """Redis's registry when one of ``tiers`` is Redis (every replica shares it), else the
    host's in ``cache_dir`` (every gateway process of the host shares it)."""
    for tier in tiers:
        if isinstance(tier, RedisTier):
            return RedisPinRegistry(tier)
    return HostPinRegistry.in_cache_dir(cache_dir)
