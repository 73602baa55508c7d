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
    that is cancelled (its client went away) stops waiting, but the work others wait on goes on
    (what is made is stored for the next request). Renditions being made have their own
    registry, which abandons what nobody waits for (:class:`gateway.speech.assembly.Assembler`).
    """

    def __init__(self) -> None:
        self._inflight: dict[str, asyncio.Task[T]] = {}

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
        return await asyncio.shield(task), leader
