"""Every Prometheus metric voxgate exports, defined once, created against an injected registry.

Nothing here imports the rest of voxgate: the gateway, the store and the synthesis side all take a
:class:`Metrics` instance and record into it. Tests build one on a fresh ``CollectorRegistry`` so
they can read exact counts without seeing other tests' traffic.

Label values always come from bounded sets (route templates, tier names, model and voice names,
format names, cache results); never from request text or content keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

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
    "multiprocess_dir",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Hits are served in well under a millisecond; misses take a fraction of a second to many seconds.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_SYNTH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


class Metrics:
    """The complete set of voxgate metrics, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # Registered first, so every collection of the registry runs the flushes of counts
        # tallied outside prometheus-client (gateway.http.observe) before reading any metric.
        self._before_collect: list[Callable[[], None]] = []
        r.register(_BeforeCollect(self._before_collect))

        # --- HTTP edge -------------------------------------------------------------------------
        self.requests = Counter(
            "voxgate_http_requests_total",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "voxgate_http_request_duration_seconds",
            "Time from request received to response ready, by route and cache result "
            "(hit, miss, coalesced, or none for requests that do not touch the store).",
            ["route", "cache"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.speech_requests = Counter(
            "voxgate_speech_requests_total",
            "Speech requests served, by model, voice, format and cache result.",
            ["model", "voice", "format", "cache"],
            registry=r,
        )
        self.fast_hits = Counter(
            "voxgate_fast_hits_total",
            "Memory hits answered from the bytes of a request answered before, ahead of HTTP "
            "parsing (also counted in voxgate_http_requests_total and the hit metrics).",
            registry=r,
        )
        self.bad_requests = Counter(
            "voxgate_bad_requests_total",
            "Requests answered 4xx because of their input, by endpoint (route template) and reason "
            "(our error code, else invalid, too_large, not_found, method_not_allowed, "
            "range_not_satisfiable).",
            ["endpoint", "reason"],
            registry=r,
        )

        # --- store -------------------------------------------------------------------------------
        self.cache_lookups = Counter(
            "voxgate_cache_lookups_total",
            "Store lookups by tier and result: hit, miss, error (tier failed: counted as a miss), "
            "skipped (tier's circuit breaker open: not asked, a miss), "
            "corrupt (checksum mismatch or bad metadata: deleted, counted as a miss) or forged "
            "(a Redis value failing authentication under the cache secret: deleted, a miss).",
            ["tier", "result"],
            registry=r,
        )
        self.cache_writes = Counter(
            "voxgate_cache_writes_total",
            "Store writes by tier and result (ok, error, skipped).",
            ["tier", "result"],
            registry=r,
        )
        self.cache_bytes = Gauge(
            "voxgate_cache_bytes",
            "Bytes held by each tier (as the tier reports them).",
            ["tier"],
            multiprocess_mode="liveall",
            registry=r,
        )
        self.cache_entries = Gauge(
            "voxgate_cache_entries",
            "Entries held by each tier.",
            ["tier"],
            multiprocess_mode="liveall",
            registry=r,
        )
        self.cache_evictions = Counter(
            "voxgate_cache_evictions_total",
            "Entries evicted to stay within a tier's size bound.",
            ["tier"],
            registry=r,
        )
        self.transcodes = Counter(
            "voxgate_transcodes_total",
            "Renditions made from an already stored master (a new format or rate without synthesis).",
            ["format"],
            registry=r,
        )
        self.coalesced = Counter(
            "voxgate_coalesced_requests_total",
            "Requests that waited on an identical synthesis already in flight instead of starting one.",
            registry=r,
        )

        # --- synthesis ---------------------------------------------------------------------------
        self.syntheses = Counter(
            "voxgate_syntheses_total",
            "Synthesis items run by an engine, by model and outcome (ok, error).",
            ["model", "outcome"],
            registry=r,
        )
        self.synthesis_seconds = Histogram(
            "voxgate_synthesis_duration_seconds",
            "Wall time an engine spent on one batch, by model.",
            ["model"],
            buckets=_SYNTH_BUCKETS,
            registry=r,
        )
        self.synthesis_busy_seconds = Counter(
            "voxgate_synthesis_seconds_total",
            "Total engine wall time, by model (divide by voxgate_audio_seconds_total for RTF).",
            ["model"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "voxgate_audio_seconds_total",
            "Seconds of audio synthesized, by model.",
            ["model"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "voxgate_synthesis_queue_depth",
            "Synthesis items waiting for an engine, by model.",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "voxgate_synthesis_queue_wait_seconds",
            "Time an item waited in the queue before its batch started, by model.",
            ["model"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "voxgate_synthesis_batch_size",
            "Items per engine batch, by model.",
            ["model"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "voxgate_synthesis_rejected_total",
            "Misses turned away because the synthesis queue was full (answered 503).",
            ["model"],
            registry=r,
        )
        self.busy_workers = Gauge(
            "voxgate_synthesis_busy_workers",
            "Engine workers currently running a batch, by model.",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.renders_refused = Counter(
            "voxgate_renders_refused_total",
            "Requests turned away because their client already had its share of renditions "
            "being made (renders_per_client; answered 429): new texts, formats and sample rates.",
            registry=r,
        )
        self.client_rejected = Counter(
            "voxgate_synthesis_client_rejected_total",
            "Misses turned away because their client already had its share of the synthesis "
            "queue waiting (queue_per_client; answered 429).",
            ["model"],
            registry=r,
        )
        self.worker_restarts = Counter(
            "voxgate_synthesis_worker_restarts_total",
            "Synthesis workers replaced after dying or hanging, by model and reason.",
            ["model", "reason"],
            registry=r,
        )
        self.engine_ready = Gauge(
            "voxgate_engine_ready",
            "1 when a model's engine is loaded and warmed, else 0.",
            ["model"],
            multiprocess_mode="livemin",
            registry=r,
        )

        # --- operations ---
        # Gauges say how several gateway processes combine (prometheus-client multiprocess mode):
        # queue depths add up, readiness is the least ready, cache sizes stay per process (pid
        # label) because the memory tier is per process while disk and Redis are shared.
        self.time_to_first_byte = Histogram(
            "voxgate_time_to_first_byte_seconds",
            "Time from request received to response headers sent, by route and cache result.",
            ["route", "cache"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.response_bytes = Counter(
            "voxgate_http_response_bytes_total",
            "Response body bytes sent, by route template.",
            ["route"],
            registry=r,
        )
        self.catalogue_prompts = Counter(
            "voxgate_catalogue_prompts_total",
            "Catalogue prompts rendered and pinned (voxgate warm, POST /v1/prompts), by cache "
            "result (hit: already stored, miss: synthesized, coalesced) or error.",
            ["result"],
            registry=r,
        )
        # The pin registry is one per host (or per Redis): every process reports the same
        # figures, read at scrape time, so the most recent report is the answer.
        self.pinned_bytes = Gauge(
            "voxgate_pinned_bytes",
            "Bytes pinned (entries never evicted, with their records) by owner: an API key's "
            "name, or (anonymous) for pins made without a key; the whole host's, or every "
            "replica's with Redis.",
            ["key"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.pinned_quota_bytes = Gauge(
            "voxgate_pinned_quota_bytes",
            "Most bytes that may be pinned: in all (scope total, pin_quota_mb) and by one API "
            "key (scope per_key, pin_quota_mb_per_key).",
            ["scope"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.pins_refused = Counter(
            "voxgate_pins_refused_total",
            "Catalogues refused whole because their pins would pass a quota, by limit "
            "(per_key, total).",
            ["limit"],
            registry=r,
        )
        self.build_info = Gauge(
            "voxgate_build_info",
            "Always 1; the labels say which voxgate and Python are running.",
            ["version", "python"],
            multiprocess_mode="livemax",
            registry=r,
        )

        # --- sentences and streaming -------------------------------------------------------------
        self.sentences_abandoned = Counter(
            "voxgate_sentences_abandoned_total",
            "Sentences never synthesized because every client waiting for their text was gone.",
            registry=r,
        )
        self.sentences = Counter(
            "voxgate_sentences_total",
            "Sentence masters used to assemble renditions, by how each was had: hit (stored), "
            "miss (synthesized) or coalesced (joined a synthesis in flight).",
            ["result"],
            registry=r,
        )
        self.streams = Counter(
            "voxgate_streams_total",
            "Streamed speech responses by outcome: complete, disconnected (the client left; "
            "synthesis and caching went on) or failed (an error after the first chunk).",
            ["outcome"],
            registry=r,
        )

        # --- Wyoming protocol (Home Assistant) -------------------------------------------------
        self.wyoming_connections = Gauge(
            "voxgate_wyoming_connections",
            "Wyoming connections open now.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.wyoming_events = Counter(
            "voxgate_wyoming_events_total",
            "Wyoming events received, by type (describe, synthesize, synthesize-start, "
            "synthesize-chunk, synthesize-stop, ping, other) and result (ok, or error: answered "
            "with an error event; refused: a connection over wyoming_max_connections).",
            ["type", "result"],
            registry=r,
        )

        self.wyoming_dropped = Counter(
            "voxgate_wyoming_connections_dropped_total",
            "Wyoming connections the server closed, by reason: idle (no event within "
            "wyoming_idle_timeout_s) or write_timeout (the client took no audio within "
            "write_timeout_s).",
            ["reason"],
            registry=r,
        )

        # --- Redis tier and cross-replica single flight ----------------------------------------
        self.redis_errors = Counter(
            "voxgate_redis_errors_total",
            "Redis commands that failed or timed out, by operation; each is a miss (or a skipped "
            "write) for that request, never a failed request.",
            ["op"],
            registry=r,
        )
        self.redis_skipped = Counter(
            "voxgate_redis_skipped_total",
            "Redis operations not attempted, by operation and reason (breaker_open: the circuit "
            "breaker is open; too_large: the entry exceeds redis_max_entry_mb).",
            ["op", "reason"],
            registry=r,
        )
        self.cache_breaker_state = Gauge(
            "voxgate_cache_breaker_state",
            "Circuit breaker of a remote tier (redis): 0 closed (in use), 1 half-open (probing), "
            "2 open (skipped until the cool-down ends).",
            ["tier"],
            registry=r,
        )
        self.redis_locks = Counter(
            "voxgate_redis_locks_total",
            "Cross-replica synthesis locks asked for, by result (acquired: this replica "
            "synthesizes; contended: another replica holds it; bypassed: Redis unavailable, "
            "synthesized locally; squatted: a lock no live replica holds (unauthenticated, expired, or "
            "with a wrong TTL), removed and taken).",
            ["result"],
            registry=r,
        )
        self.redis_lock_waits = Counter(
            "voxgate_redis_lock_waits_total",
            "Waits on another replica's synthesis lock, by outcome (result: its audio arrived; "
            "takeover: the holder went away and this replica took the lock; timeout: the wait "
            "bound passed and this replica synthesized itself; error: Redis failed mid-wait).",
            ["outcome"],
            registry=r,
        )
        self.redis_lock_wait_seconds = Histogram(
            "voxgate_redis_lock_wait_seconds",
            "Time spent waiting on another replica's synthesis lock.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )

        # --- API keys and their limits -------------------------------------------------------------
        # Key names come from the operator's keys file: a bounded set.
        self.api_key_requests = Counter(
            "voxgate_api_key_requests_total",
            "Requests that presented a known API key, by key name and result (ok; forbidden: "
            "outside its scopes; rate_limited: over its requests_per_minute).",
            ["key", "result"],
            registry=r,
        )
        self.api_key_chars = Counter(
            "voxgate_api_key_synthesis_chars_total",
            "Characters sent to synthesis (misses) on behalf of each API key.",
            ["key"],
            registry=r,
        )
        self.api_key_chars_limited = Counter(
            "voxgate_api_key_chars_limited_total",
            "Syntheses refused (429) because their key was over its chars_per_minute.",
            ["key"],
            registry=r,
        )
        self.connections_refused = Counter(
            "voxgate_connections_refused_total",
            "Connections answered 503 and closed because max_connections were open.",
            registry=r,
        )
        self.rate_limit_fallbacks = Counter(
            "voxgate_rate_limit_fallbacks_total",
            "Rate-limit checks decided without Redis because it was unreachable (the limit then "
            "holds per host, not across replicas).",
            registry=r,
        )
        self.host_table_full = Counter(
            "voxgate_host_table_full_total",
            "Rate-limit checks and queue shares counted in one gateway process because the host's "
            "shared table had no room for the key or client (the limit then holds per process).",
            registry=r,
        )
        self.rate_limit_counters_discarded = Counter(
            "voxgate_rate_limit_counters_discarded_total",
            "Rate-limit counters found in Redis that no replica could have written (a count "
            "over the limit, no TTL or a longer one), deleted when they refused a request.",
            registry=r,
        )

        # --- upstreams: remote TTS providers served as models -----------------------------------
        # The upstream label is the model name of an entry of the operator's upstreams file.
        self.upstream_calls = Counter(
            "voxgate_upstream_calls_total",
            "Calls made to an upstream provider, retries included, by result: ok, or the kind "
            "of failure (rate_limited, server, timeout, connection, auth, refused, bad_reply).",
            ["upstream", "result"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "voxgate_upstream_errors_total",
            "Misses an upstream gave no audio for (after its retries), by kind: rate_limited, "
            "server, timeout, connection, auth, refused (the caller's 400), bad_reply, "
            "breaker_open (not asked), rate_wait (no requests_per_minute slot in time).",
            ["upstream", "kind"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "voxgate_upstream_retries_total",
            "Calls to an upstream tried again, by the kind of failure that preceded them.",
            ["upstream", "kind"],
            registry=r,
        )
        self.upstream_call_seconds = Histogram(
            "voxgate_upstream_call_duration_seconds",
            "Time one call to an upstream took (each attempt), by upstream.",
            ["upstream"],
            buckets=_SYNTH_BUCKETS,
            registry=r,
        )
        self.upstream_in_flight = Gauge(
            "voxgate_upstream_calls_in_flight",
            "Calls to an upstream under way now (at most its max_concurrency per host).",
            ["upstream"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.upstream_chars_billed = Counter(
            "voxgate_upstream_chars_billed_total",
            "Characters sent to an upstream in calls that returned audio: what it bills.",
            ["upstream"],
            registry=r,
        )
        self.upstream_chars_cached = Counter(
            "voxgate_upstream_chars_cached_total",
            "Characters of an upstream's model served without a call: stored audio, or a call "
            "already in flight joined.",
            ["upstream"],
            registry=r,
        )
        self.upstream_saved = Counter(
            "voxgate_upstream_saved_total",
            "Money not spent on an upstream: characters served without a call x its "
            "price_per_million_chars / 1e6 (in the price's currency).",
            ["upstream"],
            registry=r,
        )
        self.upstream_price = Gauge(
            "voxgate_upstream_price_per_million_chars",
            "An upstream's price_per_million_chars as configured.",
            ["upstream"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.upstream_breaker_state = Gauge(
            "voxgate_upstream_breaker_state",
            "Circuit breaker of an upstream: 0 closed (asked), 1 half-open (one probe), 2 open "
            "(not asked: misses answer 503 at once, stored audio is still served).",
            ["upstream"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.upstream_rate_waits = Counter(
            "voxgate_upstream_rate_waits_total",
            "Calls that waited for a slot of the upstream's requests_per_minute.",
            ["upstream"],
            registry=r,
        )
        self.upstream_rate_fallbacks = Counter(
            "voxgate_upstream_rate_fallbacks_total",
            "requests_per_minute checks made in one process because Redis failed (the limit "
            "then holds per process, not across replicas).",
            ["upstream"],
            registry=r,
        )

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


def multiprocess_dir() -> str | None:
    """The shared metrics directory when several gateway processes serve one port, else None."""
    return os.environ.get(MULTIPROC_ENV) or None


class _BeforeCollect(Collector):
    """A collector with no metrics of its own: collecting it runs the flush hooks."""

    def __init__(self, hooks: list[Callable[[], None]]) -> None:
        self._hooks = hooks

    def describe(self) -> list[Metric]:
        return []

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
    if multiprocess_dir() is not None:
        combined = CollectorRegistry()
        MultiProcessCollector(combined)  # type: ignore[no-untyped-call]
        return generate_latest(combined)
    return generate_latest(registry)
