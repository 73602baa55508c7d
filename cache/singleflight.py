"""In-process single flight: concurrent identical misses share one computation."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """One task per key in flight; every concurrent caller for that key awaits the same task.

    The shared work runs as its own task, and callers await it through ``asyncio.shield``: a caller
    that is cancelled (its client went away) stops waiting, but the work others wait on goes on.
    With ``cancel_abandoned``, the work is cancelled once the last of its callers is: nobody is
    left to answer.
    """

    def __init__(self, *, cancel_abandoned: bool = False) -> None:
        self._inflight: dict[str, asyncio.Task[T]] = {}
        self.cancel_abandoned = cancel_abandoned
        self._waiters: dict[asyncio.Task[T], int] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    def running(self, key: str) -> bool:
        """True while work for ``key`` is in flight."""
        task = self._inflight.get(key)
        return task is not None and not task.done()

    def _finished(self, key: str, task: asyncio.Task[T]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        # Retrieve an exception nobody awaited (all callers cancelled) so asyncio does not warn.
        if not task.cancelled():
            task.exception()

    async def do(self, key: str, work: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """Run ``work`` once for ``key``; returns ``(result, leader)``.

        ``leader`` is True for the caller that started the work, False for those that joined it.
        An exception from ``work`` is raised to every caller.
        """
        task = self._inflight.get(key)
        leader = task is None
        if task is None:
            task = asyncio.ensure_future(work())
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._finished, key))
        if not self.cancel_abandoned:
            return await asyncio.shield(task), leader
        self._waiters[task] = self._waiters.get(task, 0) + 1
        try:
            return await asyncio.shield(task), leader
        finally:
            left = self._waiters[task] - 1
            if left:
                self._waiters[task] = left
            else:
                del self._waiters[task]
                if not task.done():
                    # The last caller left before the work was done (it can only have been
                    # cancelled): stop the work, and let a new caller start afresh.
                    task.cancel()
                    if self._inflight.get(key) is task:
                        del self._inflight[key]
