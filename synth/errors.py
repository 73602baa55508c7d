"""Synthesis-side errors. The gateway maps each to an HTTP status in one place.

Recoverable (the client may retry): :class:`Overloaded`, :class:`EngineDead`, :class:`SynthesisTimeout`.
Not recoverable for that input: :class:`EngineError`, and :class:`UnspeakableInput` when the input
itself holds nothing to speak (a 400, not a 500). Messages are safe to show to a client: they
never contain the request text.
"""

from __future__ import annotations

from synth.takecheck import REASONS


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


class TakeRejected(SynthesisError):
    """Every take of a sentence was refused by the take checks (:mod:`synth.takecheck`), the
    retakes included: nothing was stored. ``reasons`` are the refused takes' reasons
    (:data:`synth.takecheck.REASONS`), in the order they were first found."""

    def __init__(self, reasons: tuple[str, ...], takes: int) -> None:
        super().__init__(
            f"{takes} take(s) of this text were refused by the take checks "
            f"({', '.join(reasons)}); nothing was stored, a retry draws new takes"
        )
        self.reasons = reasons
        self.takes = takes


# The kinds of upstream failure, a bounded set: the ``kind`` label of
# ``voxgate_upstream_errors_total`` and of the calls that failed; each with the HTTP status a
# caller gets for it.
UPSTREAM_ERROR_KINDS = {
    "rate_limited": 503,  # the provider said 429 and no retry fitted within timeout_s
    "server": 502,  # 5xx after the retries
    "timeout": 503,  # no answer within timeout_s
    "connection": 503,  # refused, reset, DNS: the provider could not be reached
    "auth": 502,  # 401/403: our key is wrong (not the caller's fault)
    "refused": 400,  # 4xx the caller caused: a bad voice, text the provider will not say
    "bad_reply": 502,  # an answer that is not audio, or too large
    "breaker_open": 503,  # not asked: the provider failed repeatedly and its breaker is open
    "rate_wait": 503,  # not asked: no slot of requests_per_minute free within timeout_s
    # Not asked: voxgate's own refusals of what the upstream cannot take. They are voxgate's
    # errors (the caller's 400, with voxgate's code), not the provider's: never counted in
    # voxgate_upstream_errors_total, never told as "upstream ... refused".
    "unsupported_speed": 400,  # a speed (or SSML rate) the provider's API has no way to ask for
    "voice_not_found": 400,  # a voice the upstream's entry does not list
}
# The kinds above that voxgate decided without asking the provider, and the request field each
# is about.
OWN_REFUSALS = {"unsupported_speed": "speed", "voice_not_found": "voice"}


class UpstreamError(SynthesisError):
    """A remote TTS provider (an upstream) did not give audio. ``upstream`` names it (the
    model name clients use); ``status`` is the HTTP status the gateway answers with (502: the
    provider failed, 503: it is unavailable for now, 4xx: the caller's request was refused by
    the provider, whose message is kept); ``kind`` is one of :data:`UPSTREAM_ERROR_KINDS`;
    ``reason``, for an answer that was no usable take (``bad_reply``), is its reason
    (:data:`synth.takecheck.REASONS`: ``not_audio``, ``bad_rate``, ``too_long``), else ""."""

    def __init__(
        self,
        message: str,
        *,
        upstream: str,
        kind: str,
        status: int = 502,
        retry_after_s: float | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.upstream = upstream
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s
        self.reason = reason
        # The provider's answer was cut off for its size (its runner holds the item a while).
        self.oversize = False

    def to_wire(self) -> dict[str, object]:
        """The error as JSON values (the host's shared pool sends it to a gateway process)."""
        return {
            "kind": "UpstreamError",
            "message": str(self),
            "upstream": self.upstream,
            "upstream_kind": self.kind,
            "status": self.status,
            "retry_after_s": self.retry_after_s,
            "reason": self.reason,
        }

    @classmethod
    def from_wire(cls, message: str, header: dict[str, object]) -> UpstreamError:
        """The error :meth:`to_wire` sent; values of the wrong type fall back to a 502."""
        fields = ("upstream", "upstream_kind", "status", "retry_after_s", "reason")
        upstream, kind, status, retry, reason = (header.get(k) for k in fields)
        return cls(
            message,
            upstream=upstream if isinstance(upstream, str) else "",
            kind=kind if isinstance(kind, str) and kind in UPSTREAM_ERROR_KINDS else "server",
            status=status if type(status) is int and 400 <= status <= 599 else 502,
            retry_after_s=float(retry)
            if isinstance(retry, int | float) and 0 <= retry < 1e9
            else None,
            reason=reason if isinstance(reason, str) and reason in REASONS else "",
        )
