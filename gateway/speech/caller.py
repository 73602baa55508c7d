"""Who is asking: the one context variable of the speech path, and its one owner.

A request's edge says who it is for, once, where it knows: the route guard
(:mod:`gateway.http.charging`) the API key whose budgets it spends, the delivery of its answer
(:func:`gateway.http.delivery.client_of`, Wyoming and jambonz per connection) the client whose
shares it takes (the key's name, else the peer's address). Everything below reads it here, never
sets it: the renditions a client has being made (:class:`gateway.speech.assembly.RenderShare`),
the characters a key sends to synthesis (``KeyLimits.admit_synthesis`` in
:mod:`gateway.runtime.ratelimit`), and the synthesis queue's share, handed to the scheduler as a plain value
(:meth:`synth.scheduler.Scheduler.submit`'s ``client``: synth knows no context of ours).

Tasks inherit the variable, so every sentence of a text counts against the caller whose request
started its production. No caller (the CLI, a catalogue warm-up) is :data:`NOBODY`: bound by the
queue only.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.runtime.apikeys import APIKey


@dataclass(frozen=True, slots=True)
class Caller:
    """``client``: whose shares a request takes ("" for none); ``key``: the API key whose
    budgets it spends (None: keys off, a signed URL, the CLI)."""

    client: str = ""
    key: APIKey | None = None
    # The whole text's characters were charged before its stream began: its sentences are not
    # charged again (a refusal after the first byte could only cut the body short).
    prepaid: bool = False


NOBODY = Caller()

CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("voxgate_caller", default=NOBODY)


def caller() -> Caller:
    """Who the running request is for."""
    return CALLER.get()


def ask_as(client: str) -> None:
    """From here on (and in the tasks started from here), the running request takes the shares
    of ``client``; its key stays."""
    CALLER.set(dataclasses.replace(CALLER.get(), client=client))


@contextlib.contextmanager
def charged_to(key: APIKey) -> Iterator[None]:
    """Within the block, the running request spends ``key``'s budgets."""
    token = CALLER.set(dataclasses.replace(CALLER.get(), key=key))
    try:
        yield
    finally:
        CALLER.reset(token)


def prepaid() -> None:
    """From here on (and in the tasks started from here), the running request's characters are
    charged: its sentences' syntheses spend nothing more."""
    CALLER.set(dataclasses.replace(CALLER.get(), prepaid=True))
