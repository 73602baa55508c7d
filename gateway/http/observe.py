"""Per-request observation: Prometheus counters and timers plus the access-log line."""

from __future__ import annotations

from typing import Any

from gateway.runtime.accesslog import AccessLog
from metrics import Metrics


class RequestObserver:
    """Counts, times and logs every request. Labelled metric children are resolved once per
    (route, method, status, cache result) and kept: resolving ``labels()`` on every request was
    a measurable part of a cache hit."""

    def __init__(self, metrics: Metrics, log: AccessLog) -> None:
        self.metrics = metrics
        self.log = log
        self._children: dict[tuple[str, str, int, str], tuple[Any, Any, Any, Any]] = {}
        self._speech: dict[tuple[str, str, str, str], Any] = {}

    def count_speech(self, model: str, voice: str, fmt: str, cache: str) -> None:
        """Count one speech response by model, voice, format and cache result."""
        k = (model, voice, fmt, cache)
        child = self._speech.get(k)
        if child is None:
            child = self._speech[k] = self.metrics.speech_requests.labels(*k)
        child.inc()

    def _resolve(self, k: tuple[str, str, int, str]) -> tuple[Any, Any, Any, Any]:
        route, method, status, cache = k
        m = self.metrics
        children = (
            m.requests.labels(route, method, str(status)),
            m.request_seconds.labels(route, cache),
            m.time_to_first_byte.labels(route, cache),
            m.response_bytes.labels(route),
        )
        self._children[k] = children
        return children

    def observe(
        self,
        *,
        route: str,
        method: str,
        status: int,
        cache: str,
        key: str | None,
        seconds: float,
        nbytes: int,
        ttfb: float | None = None,
        client: str | None = None,
    ) -> None:
        """Record one answered request (``route`` is the route template, never the path)."""
        k = (route, method, status, cache)
        children = self._children.get(k)
        if children is None:
            children = self._resolve(k)
        counter, timer, first, sent = children
        counter.inc()
        timer.observe(seconds)
        first.observe(seconds if ttfb is None else ttfb)
        sent.inc(nbytes)
        self.log.record(
            route=route,
            method=method,
            status=status,
            key=key,
            cache=cache,
            seconds=seconds,
            nbytes=nbytes,
            client=client,
        )
