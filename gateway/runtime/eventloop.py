"""Which event loop the server runs on: uvloop when it is there, else asyncio's own.

Why uvloop: a gateway's time goes into the loop itself (selecting, reading into and writing out of
sockets, waking tasks), and uvloop runs all of that in C on libuv. The gateway does several loop
round trips per request (the client, Redis, the response) where a bare aiohttp handler does one,
so it gains more from uvloop than a bare server does: compare
``python -m bench.scaleout --event-loop asyncio`` with ``--event-loop uvloop`` (both servers on
the same loop).

A process serving HTTP on uvloop also lifts aiohttp's ``writelines`` skip, where that is safe
(:func:`gateway.http.hits.lift_writelines_skip`, with the other aiohttp internals).

``asyncio`` stays selectable (``--event-loop asyncio``) for platforms without uvloop (Windows)
and to rule the loop out when debugging.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")


class EventLoopUnavailable(RuntimeError):
    """The configured event loop cannot be had here (``uvloop`` asked for, not installed)."""


def resolve(choice: str) -> str:
    """``"uvloop"`` or ``"asyncio"``: what ``choice`` (one of :data:`CHOICES`) means here."""
    if choice not in CHOICES:
        raise ValueError(f"event loop must be one of {', '.join(CHOICES)} (got {choice!r})")
    installed = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not installed:
        raise EventLoopUnavailable(
            "event_loop is uvloop but uvloop is not installed: pip install uvloop, "
            "or set --event-loop asyncio"
        )
    if choice == "auto":
        return "uvloop" if installed else "asyncio"
    return choice


def factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function that makes a new loop of the kind ``choice`` resolves to."""
    if resolve(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def describe(loop: asyncio.AbstractEventLoop) -> str:
    """The loop's implementation and version, for the startup log."""
    return _named("uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio")


def label(choice: str) -> str:
    """What ``choice`` runs on here, with its version (``"uvloop 0.23.0"``), for benchmarks."""
    return _named(resolve(choice))


def _named(kind: str) -> str:
    if kind == "uvloop":
        import uvloop

        return f"uvloop {getattr(uvloop, '__version__', '?')}"
    return "asyncio"


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """``asyncio.run(main)`` on the loop ``choice`` selects."""
    with asyncio.Runner(loop_factory=factory(choice)) as runner:
        return runner.run(main)
