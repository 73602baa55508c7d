"""The tiered store: read top-down, promote on hit, write to every tier; a failing tier is a miss."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from cache.entry import CorruptEntry, Entry, ForgedEntry
from cache.memory import MemoryTier
from cache.tier import PurgeFilter, Tier, TierError, TierStats, TierUnavailable
from metrics import Metrics

log = logging.getLogger("voxgate.cache")


@dataclass(frozen=True)
class Lookup:
    """A store hit: the entry and the name of the tier that had it."""

    entry: Entry
    tier: str


class TieredStore:
    """Memory, then disk, then (optionally) Redis.

    Every tier error or timeout is counted and treated as a miss for that request: the tier below,
    or the engine, still answers. A checksum mismatch is counted as ``corrupt`` (an authentication
    failure as ``forged``), the entry is deleted from that tier, and the lookup goes on as a miss.
    """

    def __init__(self, tiers: Sequence[Tier], metrics: Metrics) -> None:
        self.tiers = list(tiers)
        self.metrics = metrics
        first = self.tiers[0]
        self._memory = first if isinstance(first, MemoryTier) else None
        # Memory hits are tallied in a plain int and added to the counter before each collection
        # (and at close): a locked prometheus-client increment per hit was a visible share of the
        # hit path's own CPU time (py-spy, bench/hit_path.py zipf).
        self._memory_hits = metrics.cache_lookups.labels(MemoryTier.name, "hit")
        self._memory_hits_pending = 0
        metrics.before_collect(self.flush_memory_hits)
        # Background writes (promotions) are kept referenced until done, else they can be GC'd.
        self._background: set[asyncio.Task[None]] = set()

    def get_memory(self, key: str) -> Entry | None:
        """The hot path: a synchronous memory-tier lookup with no awaits, counted as a hit."""
        if self._memory is None:
            return None
        entry = self._memory.get_nowait(key)
        if entry is not None:
            self._memory_hits_pending += 1
        return entry

    async def find(self, key: str) -> Entry | None:
        """The entry under ``key``: from memory without an await when there, else :meth:`get`."""
        entry = self.get_memory(key)
        if entry is None:
            found = await self.get(key)
            entry = found.entry if found is not None else None
        return entry

    def flush_memory_hits(self) -> None:
        """Add the memory hits tallied since the last flush to the lookup counter."""
        pending, self._memory_hits_pending = self._memory_hits_pending, 0
        if pending:
            self._memory_hits.inc(pending)

    async def get(self, key: str) -> Lookup | None:
        """Look ``key`` up top-down; on a hit below the top, promote it into the tiers above."""
        for depth, tier in enumerate(self.tiers):
            try:
                entry = await tier.get(key)
            except CorruptEntry as exc:
                # Never served: rot (corrupt) or a value someone without the cache secret wrote
                # (forged), told apart because the second is an attack to look into.
                result = "forged" if isinstance(exc, ForgedEntry) else "corrupt"
                self.metrics.cache_lookups.labels(tier.name, result).inc()
                log.warning("%s entry deleted key=%s tier=%s: %s", result, key, tier.name, exc)
                await self._delete_quietly(tier, key)
                continue
            except TierUnavailable:
                self.metrics.cache_lookups.labels(tier.name, "skipped").inc()
                continue
            except TierError as exc:
                self.metrics.cache_lookups.labels(tier.name, "error").inc()
                log.warning("tier error on get key=%s tier=%s: %s", key, tier.name, exc)
                continue
            self.metrics.cache_lookups.labels(tier.name, "miss" if entry is None else "hit").inc()
            if entry is None:
                continue
            if depth:
                await self._promote(key, entry, self.tiers[:depth])
            return Lookup(entry, tier.name)
        return None

    async def _promote(self, key: str, entry: Entry, tiers: Sequence[Tier]) -> None:
        for tier in tiers:
            if isinstance(tier, MemoryTier):
                await tier.put(key, entry)  # in-process and instant: do it before answering
            else:
                task = asyncio.ensure_future(self._put_one(tier, key, entry))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _put_one(self, tier: Tier, key: str, entry: Entry) -> None:
        try:
            await tier.put(key, entry)
        except TierUnavailable:
            self.metrics.cache_writes.labels(tier.name, "skipped").inc()
        except TierError as exc:
            self.metrics.cache_writes.labels(tier.name, "error").inc()
            log.warning("tier error on put key=%s tier=%s: %s", key, tier.name, exc)
        else:
            self.metrics.cache_writes.labels(tier.name, "ok").inc()

    async def put(self, key: str, entry: Entry) -> None:
        """Write ``entry`` to every tier (concurrently). Tier failures are counted, not raised."""
        await asyncio.gather(*(self._put_one(t, key, entry) for t in self.tiers))

    async def _delete_quietly(self, tier: Tier, key: str) -> bool:
        try:
            return await tier.delete(key)
        except TierError as exc:
            log.warning("tier error on delete key=%s tier=%s: %s", key, tier.name, exc)
            return False

    async def delete(self, key: str) -> bool:
        """Delete ``key`` from every tier; True if any tier held it."""
        results = await asyncio.gather(*(self._delete_quietly(t, key) for t in self.tiers))
        return any(results)

    async def purge(self, match: PurgeFilter) -> dict[str, int]:
        """Remove the entries ``match`` selects from every tier; entries removed per tier.

        A tier that fails is reported as -1 (and logged) rather than failing the whole purge.
        """
        out: dict[str, int] = {}
        for tier in self.tiers:
            try:
                out[tier.name] = await tier.purge(match)
            except TierError as exc:
                log.warning("tier error on purge tier=%s: %s", tier.name, exc)
                out[tier.name] = -1
        return out

    async def stats(self) -> list[TierStats]:
        """Each tier's size; a tier that fails to answer is left out (and logged)."""
        out: list[TierStats] = []
        for tier in self.tiers:
            try:
                out.append(await tier.stats())
            except TierError as exc:
                log.warning("tier error on stats tier=%s: %s", tier.name, exc)
        for s in out:
            self.metrics.cache_entries.labels(s.name).set(s.entries)
            self.metrics.cache_bytes.labels(s.name).set(s.bytes)
        return out

    async def drain(self) -> None:
        """Wait for background writes (promotions) to finish."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def close(self) -> None:
        """Finish background writes, then close every tier (bottom-up)."""
        await self.drain()
        self.flush_memory_hits()
        for tier in reversed(self.tiers):
            await tier.close()
