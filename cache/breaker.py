"""A circuit breaker for a remote tier: after repeated failures, stop asking for a while.

What it spares a request while Redis is down or slow: docs/scale-out.md, "When Redis goes away".
A failed half-open probe opens it for another ``reset_s``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class BreakerState(enum.IntEnum):
    """Breaker states; the values are what the state gauge exports."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Consecutive-failure circuit breaker. Not thread-safe: use it from one event loop."""

    def __init__(
        self,
        failures: int = 5,
        reset_s: float = 2.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerState], None] | None = None,
    ) -> None:
        self.failures = failures
        self.reset_s = reset_s
        self._clock = clock
        self.on_change = on_change
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._probe_started: float | None = None

    @property
    def state(self) -> BreakerState:
        """The current state (an open breaker past its cool-down reads as half-open)."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.reset_s:
            self._set(BreakerState.HALF_OPEN)
        return self._state

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            self._state = state
            if self.on_change is not None:
                self.on_change(state)

    def allow(self) -> bool:
        """May a call go to the tier now? In half-open state, one probe at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        now = self._clock()
        # A probe whose caller was cancelled never reports back; after a cool-down another may go.
        if self._probe_started is None or now - self._probe_started >= self.reset_s:
            self._probe_started = now
            return True
        return False

    def success(self) -> None:
        """A call succeeded: close the breaker."""
        self._consecutive = 0
        self._probe_started = None
        self._set(BreakerState.CLOSED)

    def failure(self) -> None:
        """A call failed or timed out: count it; open after ``failures`` in a row (or any probe)."""
        self._consecutive += 1
        self._probe_started = None
        if self._state is BreakerState.HALF_OPEN or self._consecutive >= self.failures:
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)
