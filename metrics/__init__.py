"""Every Prometheus metric voxgate exports, defined once, created against an injected registry.

Nothing here imports the rest of voxgate: the gateway, the store and the synthesis side all take a
:class:`Metrics` instance and record into it. Tests build one on a fresh ``CollectorRegistry`` so
they can read exact counts without seeing other tests' traffic.

Label values always come from bounded sets (route templates, tier names, model names, the voice
names the config lists (any other voice id is ``other``), format names, cache results); never from
request text or content keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE_LATEST",
    "LATENCY_BUCKETS",
    "MULTIPROC_ENV",
    "Metrics",
    "exposition",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_SYNTH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Hits are served in well under a millisecond; misses take a fraction of a second to many seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, *_SYNTH_BUCKETS[:-1])
_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


# How a gauge of several gateway processes combines (prometheus-client multiprocess mode): queue
# depths add up, readiness is the least ready, cache sizes stay per process (pid label) because
# the memory tier is per process while disk and Redis are shared.
_Mode = Literal["all", "liveall", "livesum", "livemin", "livemax", "livemostrecent"]


def _named(spec: str) -> tuple[str, list[str]]:
    """``"voxgate_cache_writes_total{tier,result}"``: the name and label names, written as
    PromQL writes a selector."""
    name, _, labels = spec.partition("{")
    return name, labels.rstrip("}").split(",") if labels else []


class _Declare:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, spec: str, doc: str) -> Counter:
        name, labels = _named(spec)
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, spec: str, doc: str, mode: _Mode = "all") -> Gauge:
        name, labels = _named(spec)
        return Gauge(name, doc, labels, registry=self.registry, multiprocess_mode=mode)

    def histogram(self, spec: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        name, labels = _named(spec)
        return Histogram(name, doc, labels, registry=self.registry, buckets=buckets)


class HttpMetrics:
    """The HTTP edge: requests, their latency and bytes, and what the process is."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = _Declare(registry)
        self.requests = m.counter(
            "voxgate_http_requests_total{route,method,status}",
            "HTTP requests answered, by route template, method and status code.",
        )
        self.request_seconds = m.histogram(
            "voxgate_http_request_duration_seconds{route,cache}",
            "Time from request received to response ready, by route and cache result "
            "(hit, miss, coalesced, or none for requests that do not touch the store).",
            buckets=LATENCY_BUCKETS,
        )
        self.time_to_first_byte = m.histogram(
            "voxgate_time_to_first_byte_seconds{route,cache}",
            "Time from request received to response headers sent, by route and cache result.",
            buckets=LATENCY_BUCKETS,
        )
        self.response_bytes = m.counter(
            "voxgate_http_response_bytes_total{route}",
            "Response body bytes sent, by route template.",
        )
        self.speech_requests = m.counter(
            "voxgate_speech_requests_total{model,voice,format,cache}",
            "Speech requests served, by model, voice, format and cache result.",
        )
        self.fast_hits = m.counter(
            "voxgate_fast_hits_total",
            "Memory hits answered from the bytes of a request answered before, ahead of HTTP "
            "parsing (also counted in voxgate_http_requests_total and the hit metrics).",
        )
        self.bad_requests = m.counter(
            "voxgate_bad_requests_total{endpoint,reason}",
            "Requests answered 4xx because of their input, by endpoint (route template) and reason "
            "(our error code, else invalid, too_large, not_found, method_not_allowed, "
            "range_not_satisfiable).",
        )
        self.streams = m.counter(
            "voxgate_streams_total{outcome}",
            "Streamed speech responses by outcome: complete, disconnected (the client left; "
            "synthesis and caching went on) or failed (an error after the first chunk).",
        )
        self.connections_refused = m.counter(
            "voxgate_connections_refused_total",
            "Connections answered 503 and closed because max_connections were open.",
        )
        self.build_info = m.gauge(
            "voxgate_build_info{version,python}",
            "Always 1; the labels say which voxgate and Python are running.",
            mode="livemax",
        )


class CacheMetrics:
    """The store and its tiers, the pins, and the Redis tier with its cross-replica single flight."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = _Declare(registry)
        self.cache_lookups = m.counter(
            "voxgate_cache_lookups_total{tier,result}",
            "Store lookups by tier and result: hit, miss, error (tier failed: counted as a miss), "
            "skipped (tier's circuit breaker open: not asked, a miss), "
            "corrupt (checksum mismatch or bad metadata: deleted, counted as a miss) or forged "
            "(a Redis value failing authentication under the cache secret: deleted, a miss).",
        )
        self.cache_writes = m.counter(
            "voxgate_cache_writes_total{tier,result}",
            "Store writes by tier and result (ok, error, skipped).",
        )
        self.cache_bytes = m.gauge(
            "voxgate_cache_bytes{tier}",
            "Bytes held by each tier (as the tier reports them).",
            mode="liveall",
        )
        self.cache_entries = m.gauge(
            "voxgate_cache_entries{tier}",
            "Entries held by each tier.",
            mode="liveall",
        )
        self.cache_evictions = m.counter(
            "voxgate_cache_evictions_total{tier}",
            "Entries evicted to stay within a tier's size bound.",
        )
        self.cache_space_evictions = m.counter(
            "voxgate_cache_space_evictions_total{tier}",
            "Entries the disk tier evicted because its file system was full (ENOSPC) before "
            "the tier's size bound, to store a new entry.",
        )
        self.transcodes = m.counter(
            "voxgate_transcodes_total{format}",
            "Renditions made from an already stored master (a new format or rate without synthesis).",
        )
        self.coalesced = m.counter(
            "voxgate_coalesced_requests_total",
            "Requests that waited on an identical synthesis already in flight instead of starting one.",
        )
        self.catalogue_prompts = m.counter(
            "voxgate_catalogue_prompts_total{result}",
            "Catalogue prompts rendered and pinned (voxgate warm, POST /v1/prompts), by cache "
            "result (hit: already stored, miss: synthesized, coalesced) or error.",
        )
        # The pin registry is one per host (or per Redis): every process reports the same
        # figures, read at scrape time, so the most recent report is the answer.
        self.pinned_bytes = m.gauge(
            "voxgate_pinned_bytes{key}",
            "Bytes pinned (entries never evicted, with their records) by owner: an API key's "
            "name, or (anonymous) for pins made without a key; the whole host's, or every "
            "replica's with Redis.",
            mode="livemostrecent",
        )
        self.pinned_quota_bytes = m.gauge(
            "voxgate_pinned_quota_bytes{scope}",
            "Most bytes that may be pinned: in all (scope total, pin_quota_mb) and by one API "
            "key (scope per_key, pin_quota_mb_per_key).",
            mode="livemostrecent",
        )
        self.pins_refused = m.counter(
            "voxgate_pins_refused_total{limit}",
            "Catalogues refused whole because their pins would pass a quota, by limit "
            "(per_key, total).",
        )
        self.redis_errors = m.counter(
            "voxgate_redis_errors_total{op}",
            "Redis commands that failed or timed out, by operation; each is a miss (or a skipped "
            "write) for that request, never a failed request.",
        )
        self.redis_skipped = m.counter(
            "voxgate_redis_skipped_total{op,reason}",
            "Redis operations not attempted, by operation and reason (breaker_open: the circuit "
            "breaker is open; too_large: the entry exceeds redis_max_entry_mb).",
        )
        self.cache_breaker_state = m.gauge(
            "voxgate_cache_breaker_state{tier}",
            "Circuit breaker of a remote tier (redis): 0 closed (in use), 1 half-open (probing), "
            "2 open (skipped until the cool-down ends).",
        )
        self.redis_locks = m.counter(
            "voxgate_redis_locks_total{result}",
            "Cross-replica synthesis locks asked for, by result (acquired: this replica "
            "synthesizes; contended: another replica holds it; bypassed: Redis unavailable, "
            "synthesized locally; squatted: a lock no live replica holds (unauthenticated, expired, or "
            "with a wrong TTL), removed and taken).",
        )
        self.redis_lock_waits = m.counter(
            "voxgate_redis_lock_waits_total{outcome}",
            "Waits on another replica's synthesis lock, by outcome (result: its audio arrived; "
            "takeover: the holder went away and this replica took the lock; timeout: the wait "
            "bound passed and this replica synthesized itself; error: Redis failed mid-wait).",
        )
        self.redis_lock_wait_seconds = m.histogram(
            "voxgate_redis_lock_wait_seconds",
            "Time spent waiting on another replica's synthesis lock.",
            buckets=_WAIT_BUCKETS,
        )


class SynthesisMetrics:
    """The engines, their queues and workers, and the sentences renditions are made of."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = _Declare(registry)
        self.syntheses = m.counter(
            "voxgate_syntheses_total{model,outcome}",
            "Synthesis items run by an engine, by model and outcome (ok, error).",
        )
        self.synthesis_seconds = m.histogram(
            "voxgate_synthesis_duration_seconds{model}",
            "Wall time an engine spent on one batch, by model.",
            buckets=_SYNTH_BUCKETS,
        )
        self.synthesis_busy_seconds = m.counter(
            "voxgate_synthesis_seconds_total{model}",
            "Total engine wall time, by model (divide by voxgate_audio_seconds_total for RTF).",
        )
        self.audio_seconds = m.counter(
            "voxgate_audio_seconds_total{model}",
            "Seconds of audio synthesized, by model.",
        )
        self.queue_depth = m.gauge(
            "voxgate_synthesis_queue_depth{model}",
            "Synthesis items waiting for an engine, by model.",
            mode="livesum",
        )
        self.queue_wait_seconds = m.histogram(
            "voxgate_synthesis_queue_wait_seconds{model}",
            "Time an item waited in the queue before its batch started, by model.",
            buckets=_WAIT_BUCKETS,
        )
        self.batch_size = m.histogram(
            "voxgate_synthesis_batch_size{model}",
            "Items per engine batch, by model.",
            buckets=_BATCH_BUCKETS,
        )
        self.rejected = m.counter(
            "voxgate_synthesis_rejected_total{model}",
            "Misses turned away because the synthesis queue was full (answered 503).",
        )
        self.busy_workers = m.gauge(
            "voxgate_synthesis_busy_workers{model}",
            "Engine workers currently running a batch, by model.",
            mode="livesum",
        )
        self.worker_restarts = m.counter(
            "voxgate_synthesis_worker_restarts_total{model,reason}",
            "Synthesis workers replaced after dying or hanging, by model and reason.",
        )
        self.engine_ready = m.gauge(
            "voxgate_engine_ready{model}",
            "1 when a model's engine is loaded and warmed, else 0.",
            mode="livemin",
        )
        self.sentences_abandoned = m.counter(
            "voxgate_sentences_abandoned_total",
            "Sentences never synthesized because every client waiting for their text was gone.",
        )
        self.rendition_waiters = m.gauge(
            "voxgate_rendition_waiters",
            "Requests following a rendition in the making: waiting for it whole, or streaming it "
            "as it is made (identical requests join one; a host's processes summed).",
            mode="livesum",
        )
        self.takes = m.counter(
            "voxgate_takes_total{model,verdict,reason}",
            "New takes checked before the store keeps them, by model and verdict (accepted, "
            "rejected); a rejected take counts once, under its first reason (synth/takecheck.py), "
            'an accepted one under reason "".',
        )
        self.sentences = m.counter(
            "voxgate_sentences_total{result}",
            "Sentence masters used to assemble renditions, by how each was had: hit (stored), "
            "miss (synthesized) or coalesced (joined a synthesis in flight).",
        )


class UpstreamMetrics:
    """Remote TTS providers served as models: the upstream label is the model name of an entry of
    the operator's upstreams file."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = _Declare(registry)
        self.upstream_calls = m.counter(
            "voxgate_upstream_calls_total{upstream,result}",
            "Calls made to an upstream provider, retries included, by result: ok, or the kind "
            "of failure (rate_limited, server, timeout, connection, auth, refused, bad_reply).",
        )
        self.upstream_errors = m.counter(
            "voxgate_upstream_errors_total{upstream,kind}",
            "Misses an upstream gave no audio for (after its retries), by kind: rate_limited, "
            "server, timeout, connection, auth, refused (the caller's 400), bad_reply, "
            "breaker_open (not asked), rate_wait (no requests_per_minute slot in time). "
            "voxgate's own refusals (a speed or voice the upstream cannot take) are not counted.",
        )
        self.upstream_retries = m.counter(
            "voxgate_upstream_retries_total{upstream,kind}",
            "Calls to an upstream tried again, by the kind of failure that preceded them.",
        )
        self.upstream_call_seconds = m.histogram(
            "voxgate_upstream_call_duration_seconds{upstream}",
            "Time one call to an upstream took (each attempt), by upstream.",
            buckets=_SYNTH_BUCKETS,
        )
        self.upstream_in_flight = m.gauge(
            "voxgate_upstream_calls_in_flight{upstream}",
            "Calls to an upstream under way now (at most its max_concurrency per host).",
            mode="livesum",
        )
        self.upstream_chars_billed = m.counter(
            "voxgate_upstream_chars_billed_total{upstream}",
            "Characters sent to an upstream in calls that returned audio: what it bills.",
        )
        self.upstream_chars_cached = m.counter(
            "voxgate_upstream_chars_cached_total{upstream}",
            "Characters of an upstream's model served without a call: stored audio, or a call "
            "already in flight joined.",
        )
        self.upstream_saved = m.counter(
            "voxgate_upstream_saved_total{upstream}",
            "Money not spent on an upstream: characters served without a call x its "
            "price_per_million_chars / 1e6 (in the price's currency).",
        )
        self.upstream_price = m.gauge(
            "voxgate_upstream_price_per_million_chars{upstream}",
            "An upstream's price_per_million_chars as configured.",
            mode="livemax",
        )
        self.upstream_breaker_state = m.gauge(
            "voxgate_upstream_breaker_state{upstream}",
            "Circuit breaker of an upstream: 0 closed (asked), 1 half-open (one probe), 2 open "
            "(not asked: misses answer 503 at once, stored audio is still served).",
            mode="livemax",
        )
        self.upstream_rate_waits = m.counter(
            "voxgate_upstream_rate_waits_total{upstream}",
            "Calls that waited for a slot of the upstream's requests_per_minute.",
        )
        self.upstream_rate_fallbacks = m.counter(
            "voxgate_upstream_rate_fallbacks_total{upstream}",
            "requests_per_minute checks made in one process because Redis failed (the limit "
            "then holds per process, not across replicas).",
        )


class KeyMetrics:
    """API keys and the limits on keys and clients: key names come from the operator's keys file,
    a bounded set."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = _Declare(registry)
        self.api_key_requests = m.counter(
            "voxgate_api_key_requests_total{key,result}",
            "Requests that presented a known API key, by key name and result (ok; forbidden: "
            "outside its scopes; rate_limited: over its requests_per_minute).",
        )
        self.api_key_chars = m.counter(
            "voxgate_api_key_synthesis_chars_total{key}",
            "Characters sent to synthesis (misses) on behalf of each API key.",
        )
        self.api_key_chars_limited = m.counter(
            "voxgate_api_key_chars_limited_total{key}",
            "Syntheses refused (429) because their key was over its chars_per_minute.",
        )
        self.renders_refused = m.counter(
            "voxgate_renders_refused_total",
            "Requests turned away because their client already had its share of renditions "
            "being made (renders_per_client; answered 429): new texts, formats and sample rates.",
        )
        self.client_rejected = m.counter(
            "voxgate_synthesis_client_rejected_total{model}",
            "Misses turned away because their client already had its share of the synthesis "
            "queue waiting (queue_per_client; answered 429).",
        )
        self.rate_limit_fallbacks = m.counter(
            "voxgate_rate_limit_fallbacks_total",
            "Rate-limit checks decided without Redis because it was unreachable (the limit then "
            "holds per host, not across replicas).",
        )
        self.host_table_full = m.counter(
            "voxgate_host_table_full_total",
            "Rate-limit checks and queue shares counted in one gateway process because the host's "
            "shared table had no room for the key or client (the limit then holds per process).",
        )
        self.rate_limit_counters_discarded = m.counter(
            "voxgate_rate_limit_counters_discarded_total",
            "Rate-limit counters found in Redis that no replica could have written (a count "
            "over the limit, no TTL or a longer one), deleted when they refused a request.",
        )


class WyomingMetrics:
    """The Wyoming protocol (Home Assistant)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = _Declare(registry)
        self.wyoming_connections = m.gauge(
            "voxgate_wyoming_connections",
            "Wyoming connections open now.",
            mode="livesum",
        )
        self.wyoming_events = m.counter(
            "voxgate_wyoming_events_total{type,result}",
            "Wyoming events received, by type (describe, synthesize, synthesize-start, "
            "synthesize-chunk, synthesize-stop, select-program, ping, other) and result (ok, or "
            "error: answered with an error event; refused: a connection over "
            "wyoming_max_connections; dropped: a type this server does not answer, dropped "
            "unanswered as the protocol says).",
        )
        self.wyoming_dropped = m.counter(
            "voxgate_wyoming_connections_dropped_total{reason}",
            "Wyoming connections the server closed, by reason: idle (no event within "
            "wyoming_idle_timeout_s) or write_timeout (the client took no audio within "
            "write_timeout_s).",
        )


class Metrics(
    HttpMetrics, CacheMetrics, SynthesisMetrics, UpstreamMetrics, KeyMetrics, WyomingMetrics
):
    """Every group's metrics on ``registry``, each under its own name (``metrics.coalesced``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        # Registered first, so every collection of the registry runs the flushes of counts
        # tallied outside prometheus-client (gateway.http.observe) before reading any metric.
        self._before_collect: list[Callable[[], None]] = []
        r.register(_BeforeCollect(self._before_collect))
        HttpMetrics.__init__(self, r)
        CacheMetrics.__init__(self, r)
        SynthesisMetrics.__init__(self, r)
        UpstreamMetrics.__init__(self, r)
        KeyMetrics.__init__(self, r)
        WyomingMetrics.__init__(self, r)

    def before_collect(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` (a flush of counts kept outside prometheus-client) before every collection
        of the registry and in :meth:`flush_pending`."""
        self._before_collect.append(hook)

    def flush_pending(self) -> None:
        """Run the :meth:`before_collect` hooks now (before a multi-process exposition, which
        reads the processes' files rather than this registry)."""
        for hook in self._before_collect:
            hook()


def add_counts(
    counter: Counter, children: dict[tuple[str, ...], Any], counts: dict[tuple[str, ...], int]
) -> None:
    """Add ``counts`` (label values -> requests) to ``counter`` in bulk: what the hit path tallies
    in plain numbers (gateway.http.observe, gateway.runtime.ratelimit). Each label set's child is
    resolved once and kept in ``children`` (``labels()`` costs a lock and a lookup)."""
    for k, n in counts.items():
        child = children.get(k)
        if child is None:
            child = children[k] = counter.labels(*k)
        child.inc(n)


class _BeforeCollect(Collector):
    """A collector with no metrics of its own: collecting it runs the flush hooks."""

    def __init__(self, hooks: list[Callable[[], None]]) -> None:
        self._hooks = hooks

    def collect(self) -> list[Metric]:
        for hook in self._hooks:
            hook()
        return []


def exposition(registry: CollectorRegistry) -> bytes:
    """Render ``registry`` in the Prometheus text format.

    Under several processes (``PROMETHEUS_MULTIPROC_DIR`` set before prometheus-client was
    imported) every metric writes to files in that directory, and the answer is the aggregate of
    all processes' files rather than this process's registry.
    """
    if os.environ.get(MULTIPROC_ENV):
        combined = CollectorRegistry()
        MultiProcessCollector(combined)  # type: ignore[no-untyped-call]
        return generate_latest(combined)
    return generate_latest(registry)
