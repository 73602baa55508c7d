"""Per-request observation: Prometheus counters and timers plus the access-log line.

Requests are kept as one tuple each (an :data:`~gateway.runtime.accesslog.Observation`) and
tallied in plain numbers, added to the Prometheus metrics and made into access-log lines in bulk,
and why: docs/architecture.md, "Hit path cost". The flush runs before every collection of the
registry and at most ``FLUSH_AFTER_S`` after a request, so a multi-process scrape lags by no more
than that; an idle server schedules nothing.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from typing import Any

from gateway.runtime.accesslog import AccessLog, Observation
from metrics import LATENCY_BUCKETS, Metrics, add_counts

FLUSH_AFTER_S = 0.1
# Observations kept before a flush even within FLUSH_AFTER_S: bounds memory at any request rate,
# and the loop's pause for one flush (about 0.5 ms for 256 hits, 2.5 ms for 2,200, the 0.1 s of
# one process at 22,000 hits/s: a pause that long, ten times a second, reached wrk's p99).
MAX_PENDING = 256


class _Tally:
    """One (route, method, status, cache) label set's requests since the last flush."""

    __slots__ = ("count", "nbytes", "seconds_buckets", "seconds_sum", "ttfb_buckets", "ttfb_sum")

    def __init__(self, buckets: int) -> None:
        self.count = 0
        self.nbytes = 0
        self.seconds_sum = 0.0
        self.ttfb_sum = 0.0
        self.seconds_buckets = [0] * buckets
        self.ttfb_buckets = [0] * buckets


def add_to_histogram(child: Any, total: float, buckets: list[int]) -> None:
    """Add observations already sorted into ``child``'s buckets (non-cumulative counts, in the
    order of its upper bounds) and their ``total`` to a prometheus-client histogram child.

    prometheus-client has no bulk ``observe``; this writes the same values its ``observe`` writes
    (``_sum`` and one non-cumulative value per bucket, in-process or multi-process alike).
    tests/test_observe.py checks the result against ``observe`` on the pinned release.
    """
    child._sum.inc(total)
    for i, n in enumerate(buckets):
        if n:
            child._buckets[i].inc(n)


class RequestObserver:
    """Counts, times and logs every request. Labelled metric children are resolved once per
    label set and kept; counts are tallied here and flushed to them in bulk (module doc)."""

    def __init__(self, metrics: Metrics, log: AccessLog) -> None:
        self.metrics = metrics
        self.log = log
        self._children: dict[tuple[str, str, int, str], tuple[Any, Any, Any, Any]] = {}
        self._tallies: dict[tuple[str, str, int, str], _Tally] = {}
        self._pending: list[Observation] = []
        self._speech_children: dict[tuple[str, ...], Any] = {}
        self._speech: dict[tuple[str, ...], int] = {}
        # Both histograms have the latency buckets; prometheus-client adds +Inf last.
        self._bounds = (*LATENCY_BUCKETS, float("inf"))
        metrics.before_collect(self.flush)
        self.flush_after_s = FLUSH_AFTER_S
        self._flush_at: asyncio.TimerHandle | None = None

    def count_speech(self, model: str, voice: str, fmt: str, cache: str) -> None:
        """Count one speech response by model, voice, format and cache result."""
        k = (model, voice, fmt, cache)
        speech = self._speech
        speech[k] = speech.get(k, 0) + 1
        if self._flush_at is None:
            self._schedule_flush()

    def observe(
        self,
        route: str,
        method: str,
        status: int,
        cache: str,
        key: str | None,
        seconds: float,
        nbytes: int,
        ttfb: float | None = None,
        client: str | None = None,
        request_id: str | None = None,
    ) -> None:
        """Record one answered request (``route`` is the route template, never the path).

        Only kept here (one tuple); it is tallied and its access-log line made with the others
        at the next flush (module doc): a call per metric and per log line was a tenth of a
        hit's CPU time."""
        pending = self._pending
        pending.append(
            (
                time.time(),
                route,
                method,
                status,
                cache,
                key,
                seconds,
                seconds if ttfb is None else ttfb,
                nbytes,
                client,
                request_id,
            )
        )
        if len(pending) >= MAX_PENDING:
            self.flush()
        elif self._flush_at is None:
            self._schedule_flush()

    def _tally(self, observations: list[Observation]) -> None:
        tallies = self._tallies
        bounds = self._bounds
        for _, route, method, status, cache, _, seconds, first, nbytes, _, _ in observations:
            k = (route, method, status, cache)
            tally = tallies.get(k)
            if tally is None:
                tally = tallies[k] = _Tally(len(bounds))
            tally.count += 1
            tally.nbytes += nbytes or 0
            tally.seconds_sum += seconds
            tally.seconds_buckets[bisect_left(bounds, seconds)] += 1
            tally.ttfb_sum += first
            tally.ttfb_buckets[bisect_left(bounds, first)] += 1

    def flush(self) -> None:
        """Add everything observed since the last flush to the Prometheus metrics, and queue
        its access-log lines."""
        observations, self._pending = self._pending, []
        if observations:
            self._tally(observations)
            self.log.extend(observations)
        tallies, self._tallies = self._tallies, {}
        for k, tally in tallies.items():
            children = self._children.get(k)
            if children is None:
                route, method, status, cache = k
                m = self.metrics
                children = self._children[k] = (
                    m.requests.labels(route, method, str(status)),
                    m.request_seconds.labels(route, cache),
                    m.time_to_first_byte.labels(route, cache),
                    m.response_bytes.labels(route),
                )
            counter, timer, first, sent = children
            counter.inc(tally.count)
            add_to_histogram(timer, tally.seconds_sum, tally.seconds_buckets)
            add_to_histogram(first, tally.ttfb_sum, tally.ttfb_buckets)
            sent.inc(tally.nbytes)
        speech, self._speech = self._speech, {}
        add_counts(self.metrics.speech_requests, self._speech_children, speech)

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # recorded outside a loop (a test): the next collection flushes
            return
        self._flush_at = loop.call_later(self.flush_after_s, self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_at = None
        # Every tally kept outside prometheus-client (this one, the store's memory hits, the API
        # keys' counts): a multi-process scrape reads each process's files, not its tallies.
        self.metrics.flush_pending()

    def close(self) -> None:
        """Cancel a scheduled flush and flush what is left (at shutdown), with every other
        tally kept outside prometheus-client."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        self.metrics.flush_pending()
