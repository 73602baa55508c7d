"""cancel_and_wait: a child's cancellation is its expected end; the caller's own propagates."""

from __future__ import annotations

import asyncio

import pytest

from synth.cancellation import cancel_and_wait


class SlowToStop:
    """A child that, once cancelled, runs cleanup until the test lets it finish (so the caller is
    provably still waiting on it when the test cancels the caller)."""

    def __init__(self, *, swallow: bool = False) -> None:
        self.running = asyncio.Event()
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()
        self.swallow = swallow
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> str:
        self.running.set()
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            self.stopping.set()
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    # asyncio forwards a waiting caller's cancel to this task: a swallowing
                    # child ignores that one too.
                    if not self.swallow:
                        raise
            if not self.swallow:
                raise
        return "finished anyway"

    async def waited_on(self) -> asyncio.Task[None]:
        """A caller's ``cancel_and_wait`` of this child, once the child is stopping (cancelled,
        its cleanup held until ``release``)."""
        await self.running.wait()
        waiting = asyncio.create_task(cancel_and_wait(self.task))
        await self.stopping.wait()
        return waiting


async def test_child_cancelled_while_the_caller_is_not_returns() -> None:
    child = SlowToStop()
    waiting = await child.waited_on()
    assert not waiting.done()  # it waits for the child's cleanup
    child.release.set()
    assert await waiting is None
    assert child.task.cancelled()


async def test_caller_cancelled_while_waiting_propagates() -> None:
    child = SlowToStop()
    waiting = await child.waited_on()
    waiting.cancel()
    child.release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()
    assert child.task.cancelled()


async def test_caller_cancellation_is_kept_when_the_child_swallows_its_own() -> None:
    # asyncio hands the caller's cancel to the awaited child; a child that swallows it and
    # returns would resume the caller as if never cancelled (contextlib.suppress never sees it).
    child = SlowToStop(swallow=True)
    waiting = await child.waited_on()
    waiting.cancel()
    child.release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert child.task.result() == "finished anyway"


async def test_the_old_suppress_pattern_swallows_the_callers_cancellation() -> None:
    # The pattern this replaces, for the record: the caller's cancel is lost and it goes on.
    import contextlib

    child = SlowToStop()
    await child.running.wait()
    went_on = asyncio.Event()

    async def old_close() -> None:
        child.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await child.task
        went_on.set()

    waiting = asyncio.create_task(old_close())
    await child.stopping.wait()
    waiting.cancel()
    child.release.set()
    await waiting  # no CancelledError: swallowed
    assert went_on.is_set()


async def test_waits_for_every_child_when_already_being_cancelled() -> None:
    # A finally block that runs because the caller was cancelled must still stop its children.
    children = [SlowToStop(), SlowToStop()]
    for c in children:
        await c.running.wait()
    cleaned = asyncio.Event()

    async def owner() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(*(c.task for c in children))
            cleaned.set()

    task = asyncio.create_task(owner())
    await asyncio.sleep(0)  # let owner reach its wait (a scheduling step, not a timing guess)
    task.cancel()
    for c in children:
        await c.stopping.wait()
        c.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()
    assert all(c.task.cancelled() for c in children)


async def test_a_childs_own_failure_is_raised_after_all_finished() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    await asyncio.wait([failed])
    other = SlowToStop()
    await other.running.wait()
    waiting = asyncio.create_task(cancel_and_wait(failed, other.task))
    await other.stopping.wait()
    other.release.set()
    with pytest.raises(RuntimeError, match="boom"):
        await waiting
    assert other.task.cancelled()
