"""Synthesis-side errors. The gateway maps each to an HTTP status in one place.

Recoverable (the client may retry): :class:`Overloaded`, :class:`EngineDead`, :class:`SynthesisTimeout`.
Not recoverable for that input: :class:`EngineError`, and :class:`UnspeakableInput` when the input
itself holds nothing to speak (a 400, not a 500). Messages are safe to show to a client: they
never contain the request text.
"""

from __future__ import annotations


class SynthesisError(Exception):
    """Root of synthesis failures."""

    retry_after_s: float | None = None


class Overloaded(SynthesisError):
    """The synthesis queue is full; the miss is turned away (hits are still served)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ClientQueueFull(Overloaded):
    """This client already has its share of the queue waiting; others are still served (429)."""


class EngineError(SynthesisError):
    """The engine failed on this input."""


class UnspeakableInput(EngineError):
    """The input has nothing the voice can speak (only punctuation, say): a client error."""


class EngineDead(SynthesisError):
    """The worker running the item died (and a retry did not help)."""

    retry_after_s = 1.0


class SynthesisTimeout(SynthesisError):
    """The item did not finish within its time bound."""

    retry_after_s = 1.0
