"""Per-request observation: Prometheus counters and timers plus the access-log line."""

from __future__ import annotations

from typing import Any

from gateway.accesslog import AccessLog
from metrics import Metrics


class RequestObserver:
    """Counts, times and logs every request. Labelled metric children are cached: resolving
    ``labels()`` on every request was a measurable part of a cache hit."""

    def __init__(self, metrics: Metrics, log: AccessLog) -> None:
        self.metrics = metrics
        self.log = log
        self._counters: dict[tuple[str, str, int], Any] = {}
        self._timers: dict[tuple[str, str], Any] = {}
        self._speech: dict[tuple[str, str, str, str], Any] = {}
        self._bytes: dict[str, Any] = {}
        self._ttfb: dict[tuple[str, str], Any] = {}

    def count_speech(self, model: str, voice: str, fmt: str, cache: str) -> None:
        """Count one speech response by model, voice, format and cache result."""
        k = (model, voice, fmt, cache)
        child = self._speech.get(k)
        if child is None:
            child = self._speech[k] = self.metrics.speech_requests.labels(*k)
        child.inc()

    def observe(self, *, route: str, method: str, status: int, cache: str, key: str | None,
                seconds: float, nbytes: int, ttfb: float | None = None,
                client: str | None = None) -> None:
        """Record one answered request (``route`` is the route template, never the path)."""
        ckey = (route, method, status)
        counter = self._counters.get(ckey)
        if counter is None:
            counter = self._counters[ckey] = self.metrics.requests.labels(
                route, method, str(status))
        counter.inc()
        tkey = (route, cache)
        timer = self._timers.get(tkey)
        if timer is None:
            timer = self._timers[tkey] = self.metrics.request_seconds.labels(route, cache)
        timer.observe(seconds)
        first = self._ttfb.get(tkey)
        if first is None:
            first = self._ttfb[tkey] = self.metrics.time_to_first_byte.labels(route, cache)
        first.observe(seconds if ttfb is None else ttfb)
        sent = self._bytes.get(route)
        if sent is None:
            sent = self._bytes[route] = self.metrics.response_bytes.labels(route)
        sent.inc(nbytes)
        self.log.record(route=route, method=method, status=status, key=key, cache=cache,
                        seconds=seconds, nbytes=nbytes, client=client)
