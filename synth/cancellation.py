"""Stopping a child task without swallowing the caller's own cancellation.

``task.cancel(); with suppress(CancelledError): await task`` is the usual way to stop a child, and
it is wrong: a ``CancelledError`` raised there may be the *caller's* (its own task was cancelled
while it waited), and ``suppress`` makes the caller carry on as if nothing had happened; a
shutdown or an ``asyncio.timeout`` around it is then lost. :func:`cancel_and_wait` tells the two
apart with ``Task.cancelling()`` (Python 3.11): the child's cancellation is the end that was asked
for, the caller's propagates.

Why it lives in ``synth/``: one copy must serve the gateway, ``synth/`` and ``cache/``, and the
import rules leave no package all three may import except ``metrics/`` (which is for metrics
only). ``gateway/`` may import ``synth/``; ``cache/`` may not, so its one user
(:mod:`cache.distributed`, which keeps a lock alive while work runs) scopes that child in an
``asyncio.TaskGroup`` instead and needs no helper.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until each has finished.

    A task that ends cancelled ended as asked: not an error. When the *caller* is cancelled
    while it waits here (its ``cancelling()`` count rises), ``CancelledError`` propagates, even
    if the task it was waiting on swallowed its own cancellation and returned. A task that ended
    with another exception has it raised once every task has finished (the first such one).
    Called while the caller is already being cancelled (a ``finally`` block running because of
    a cancellation), it still waits for the tasks: only a cancellation that arrives during the
    wait interrupts it.
    """
    for task in tasks:
        task.cancel()
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0

    def caller_cancelled() -> bool:
        return current is not None and current.cancelling() > before

    failure: BaseException | None = None
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            if caller_cancelled():
                raise
            # Otherwise it is the task's own cancellation: the end this function asked for.
        except Exception as exc:  # the task failed before the cancel reached it
            if failure is None:
                failure = exc
        if caller_cancelled():
            # The task finished normally although the caller was cancelled meanwhile: asyncio
            # delivers the caller's cancellation to the awaited task, and a task that swallows
            # it leaves the caller resumed without one. Raise it here instead of losing it.
            raise asyncio.CancelledError
    if failure is not None:
        raise failure
