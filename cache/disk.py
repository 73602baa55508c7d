"""The embedded default tier: diskcache on local disk, survives restarts, nothing to install.

diskcache is synchronous (SQLite + files), so every call runs in a small dedicated thread pool and
the event loop only awaits it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import diskcache

from cache.entry import CorruptEntry, Entry
from cache.tier import PurgeFilter, TierError, TierStats, bounded

T = TypeVar("T")

# Pinned entries are tagged so that purge and eviction can tell them apart.
PINNED_TAG = "pinned"


class DiskTier:
    """A size-bounded diskcache tier. Pinned entries go to a separate, unbounded cache."""

    name = "disk"

    def __init__(
        self,
        directory: str | Path,
        max_bytes: int,
        *,
        timeout_s: float = 2.0,
        threads: int = 4,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.directory.mkdir(parents=True, exist_ok=True)
        # Two caches: the bounded one evicts least-recently-stored entries when full; the pinned
        # one (a prompt catalogue) has no size limit, so eviction can never touch it.
        self._cache = diskcache.Cache(
            str(self.directory / "lru"),
            size_limit=max_bytes,
            eviction_policy="least-recently-stored",
            timeout=timeout_s,
        )
        self._pinned = diskcache.Cache(
            str(self.directory / "pinned"),
            size_limit=2**62,
            eviction_policy="none",
            timeout=timeout_s,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="disk-tier")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await bounded(
                loop.run_in_executor(self._pool, functools.partial(fn, *args)), self.timeout_s
            )
        except (OSError, sqlite3.Error, diskcache.Timeout, TimeoutError) as exc:
            raise TierError(f"disk tier: {type(exc).__name__}: {exc}") from exc

    def _get_sync(self, key: str) -> Entry | None:
        blob = self._pinned.get(key)
        if blob is None:
            blob = self._cache.get(key)
        if blob is None:
            return None
        if not isinstance(blob, bytes):
            raise CorruptEntry("unexpected value type")
        return Entry.from_blob(blob)

    async def get(self, key: str) -> Entry | None:
        return await self._run(self._get_sync, key)

    def _put_sync(self, key: str, entry: Entry) -> None:
        blob = entry.to_blob()
        if entry.meta.pinned:
            self._pinned.set(key, blob, tag=PINNED_TAG)
            self._cache.delete(key)
        else:
            self._cache.set(key, blob)

    async def put(self, key: str, entry: Entry) -> None:
        await self._run(self._put_sync, key, entry)

    def _delete_sync(self, key: str) -> bool:
        a = bool(self._cache.delete(key))
        b = bool(self._pinned.delete(key))
        return a or b

    async def delete(self, key: str) -> bool:
        return await self._run(self._delete_sync, key)

    def iter_keys_sync(self, *, pinned: bool | None = None) -> Iterator[str]:
        """Iterate keys (synchronously; call from a thread). ``pinned`` selects one side."""
        if pinned in (None, False):
            yield from (str(k) for k in self._cache.iterkeys())
        if pinned in (None, True):
            yield from (str(k) for k in self._pinned.iterkeys())

    def _purge_sync(self, match: PurgeFilter) -> int:
        removed = 0
        sides = []
        if match.pinned in (None, False):
            sides.append(self._cache)
        if match.pinned in (None, True):
            sides.append(self._pinned)
        for cache in sides:
            for key in list(cache.iterkeys()):
                blob = cache.get(key)
                if not isinstance(blob, bytes):
                    continue
                try:
                    meta = Entry.from_blob(blob).meta
                except CorruptEntry:
                    cache.delete(key)  # unreadable: it could never be served anyway
                    removed += 1
                    continue
                if match.matches(meta) and cache.delete(key):
                    removed += 1
        return removed

    async def purge(self, match: PurgeFilter) -> int:
        # A scan is not bounded by the per-call timeout: it is an operator action, not a request.
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self._purge_sync, match)
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise TierError(f"disk tier purge: {exc}") from exc

    def _stats_sync(self) -> TierStats:
        n_lru, n_pin = len(self._cache), len(self._pinned)
        return TierStats(
            self.name,
            n_lru + n_pin,
            int(self._cache.volume()) + int(self._pinned.volume()),
            self.max_bytes,
            n_pin,
        )

    async def stats(self) -> TierStats:
        return await self._run(self._stats_sync)

    def path_of(self, key: str) -> Path | None:
        """Where diskcache keeps a large value on disk (tests use it to corrupt an entry)."""
        for cache in (self._cache, self._pinned):
            with cache.transact():
                row = cache._sql(
                    "SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)
                ).fetchone()
            if row and row[0]:
                return Path(cache.directory) / str(row[0])
        return None

    def _close_sync(self) -> None:
        self._pool.shutdown(wait=True)
        self._cache.close()
        self._pinned.close()

    async def close(self) -> None:
        await asyncio.to_thread(self._close_sync)
