"""The ``Tier`` protocol: one level of the store (memory, disk, Redis)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from cache.entry import Entry


class TierError(Exception):
    """A tier failed (I/O error, timeout, connection refused). The store treats it as a miss."""


@dataclass(frozen=True)
class TierStats:
    """Size of a tier as it reports it."""

    name: str
    entries: int
    bytes: int
    max_bytes: int | None
    pinned: int = 0


@runtime_checkable
class Tier(Protocol):
    """One store level. Every method is async and must not block the event loop.

    ``get`` returns ``None`` on a miss and raises :class:`cache.entry.CorruptEntry` when the stored
    bytes fail their checksum (the store then deletes the entry) or :class:`TierError` when the
    tier itself fails.
    """

    name: str

    async def get(self, key: str) -> Entry | None: ...

    async def put(self, key: str, entry: Entry) -> None: ...

    async def delete(self, key: str) -> bool: ...

    async def stats(self) -> TierStats: ...

    async def close(self) -> None: ...
