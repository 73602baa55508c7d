"""The ``Tier`` protocol: one level of the store (memory, disk, Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from cache.entry import Entry, EntryMeta

T = TypeVar("T")


async def bounded(aw: Awaitable[T], timeout_s: float) -> T:
    """``await aw`` within ``timeout_s`` (``TimeoutError`` after). ``asyncio.timeout`` runs it
    in the caller's task, where ``wait_for`` (before Python 3.12) wraps it in a new task:
    a measurable part of a tier hit.

    A timeout that meets a *subclass* of ``CancelledError`` is a timeout too. ``wait_for2``
    (which pipecat installs as ``asyncio.wait_for`` on Python < 3.12, so redis-py uses it once
    pipecat is imported) raises ``CancelledWithResultError`` when our timeout's cancellation
    races a send it was wrapping; Python 3.11's ``asyncio.timeout`` turns only ``CancelledError``
    itself into ``TimeoutError`` (3.12 turns any subclass), so the subclass would leave as a
    cancellation of the whole request (seen in a clean-clone run: a Redis Cluster lock call).
    """
    task = asyncio.current_task()
    cancelling = task.cancelling() if task is not None else 0
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            return await aw
    except asyncio.CancelledError as exc:
        # Ours when the timeout fired and no one else asked to cancel the task (3.12's rule).
        if timeout.expired() and (task is None or task.cancelling() <= cancelling):
            raise TimeoutError(f"not done within {timeout_s:g} s") from exc
        raise


class TierError(Exception):
    """A tier failed (I/O error, timeout, connection refused). The store treats it as a miss."""


class TierUnavailable(TierError):
    """The tier was not asked at all (its circuit breaker is open): a miss, counted as skipped.

    Kept apart from :class:`TierError` so an outage is counted once per request without a warning
    logged per request.
    """


@dataclass(frozen=True)
class TierStats:
    """Size of a tier as it reports it."""

    name: str
    entries: int
    bytes: int
    max_bytes: int | None
    pinned: int = 0
    # The disk tier on a full file system (ENOSPC): entries this process evicted to make room,
    # and whether its last write still found no room (nothing left to evict: not stored).
    evicted_for_space: int = 0
    full: bool = False


@dataclass(frozen=True)
class PurgeFilter:
    """Which entries a purge removes. Every given criterion must match; none given matches all.

    ``older_than`` is a Unix time: entries created before it match. ``pinned`` restricts to pinned
    (True) or unpinned (False) entries; None takes both.
    """

    voice: str | None = None
    model: str | None = None
    older_than: float | None = None
    pinned: bool | None = None
    # Only these content addresses: for the pin registry's records (``voxgate audit`` forgets
    # the pins it evicted); a tier's purge does not select by address and refuses it.
    keys: frozenset[str] | None = None

    def matches(self, meta: EntryMeta) -> bool:
        """True when ``meta`` is selected by this filter."""
        if self.keys is not None:
            raise ValueError("a tier purge does not select by content address")
        return self.selects(meta.voice, meta.model, meta.created, meta.pinned)

    def selects(
        self, voice: str, model: str, created: float, pinned: bool, key: str | None = None
    ) -> bool:
        """True when an entry of this voice, model, age, pin and address is selected."""
        return (
            (self.keys is None or key in self.keys)
            and (self.voice is None or voice == self.voice)
            and (self.model is None or model == self.model)
            and (self.older_than is None or created < self.older_than)
            and (self.pinned is None or pinned == self.pinned)
        )


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

    async def purge(self, match: PurgeFilter) -> int: ...

    async def close(self) -> None: ...
