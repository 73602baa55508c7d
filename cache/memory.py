"""A byte-bounded in-process LRU: the tier that serves the hottest prompts in microseconds."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from cache.entry import Entry
from cache.tier import PurgeFilter, TierStats


class MemoryTier:
    """LRU bounded by total audio bytes. Pinned entries are never evicted, and they count
    against the same bound: a pinned entry that would take the pinned bytes past it is not
    kept here (a lower tier keeps it). So the flag, which a promotion copies from a lower tier
    (Redis is shared), never lets an entry past the bound: once an 8 MiB entry marked pinned
    entered a 1 MiB memory tier. Entries are kept as objects, not re-verified on read (why:
    docs/architecture.md, "Store").
    """

    name = "memory"

    def __init__(self, max_bytes: int, on_evict: Callable[[int], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._bytes = 0
        self._pinned_bytes = 0
        self._on_evict = on_evict

    def get_nowait(self, key: str) -> Entry | None:
        """Synchronous lookup; safe on the event loop (no I/O)."""
        entry = self._items.get(key)
        if entry is not None:
            self._items.move_to_end(key)
        return entry

    async def get(self, key: str) -> Entry | None:
        return self.get_nowait(key)

    async def put(self, key: str, entry: Entry) -> None:
        old = self._items.get(key)
        if entry.meta.pinned:
            freed = old.size if old is not None and old.meta.pinned else 0
            if self._pinned_bytes - freed + entry.size > self.max_bytes:
                return  # over the bound even with everything unpinned gone: a lower tier keeps it
        elif entry.size > self.max_bytes:
            return  # would evict everything else; a lower tier keeps it
        self._forget(key)
        self._items[key] = entry
        self._bytes += entry.size
        if entry.meta.pinned:
            self._pinned_bytes += entry.size
        self._evict()

    def _forget(self, key: str) -> Entry | None:
        entry = self._items.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
            if entry.meta.pinned:
                self._pinned_bytes -= entry.size
        return entry

    def _evict(self) -> None:
        if self._bytes <= self.max_bytes:
            return
        evicted = 0
        for key in [k for k, e in self._items.items() if not e.meta.pinned]:
            if self._bytes <= self.max_bytes:
                break
            self._forget(key)
            evicted += 1
        if evicted and self._on_evict is not None:
            self._on_evict(evicted)

    async def delete(self, key: str) -> bool:
        return self._forget(key) is not None

    async def purge(self, match: PurgeFilter) -> int:
        doomed = [k for k, e in self._items.items() if match.matches(e.meta)]
        for key in doomed:
            self._forget(key)
        return len(doomed)

    async def stats(self) -> TierStats:
        pinned = sum(1 for e in self._items.values() if e.meta.pinned)
        return TierStats(self.name, len(self._items), self._bytes, self.max_bytes, pinned)

    async def close(self) -> None:
        self._items.clear()
        self._bytes = self._pinned_bytes = 0
