"""The request tallies of gateway.http.observe reach Prometheus exactly as direct updates would."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import math
import random
import time

from prometheus_client import CollectorRegistry, generate_latest

from gateway.http.observe import RequestObserver
from gateway.runtime.accesslog import AccessLog
from gateway.runtime.ratelimit import KeyLimits
from metrics import LATENCY_BUCKETS, Metrics


def _observations(seed: int, n: int) -> list[tuple[str, str, int, str, float, float, int]]:
    rng = random.Random(seed)
    routes = [("/v1/audio/speech", "POST"), ("/v1/audio/{key}", "GET"), ("/healthz", "GET")]
    out = []
    for _ in range(n):
        route, method = rng.choice(routes)
        status = rng.choice([200, 200, 200, 304, 400, 404])
        cache = rng.choice(["hit", "miss", "coalesced", "none"])
        # Bucket edges exactly, values between them, and beyond the last one (+Inf).
        seconds = rng.choice([*LATENCY_BUCKETS, rng.uniform(0, 0.01), rng.uniform(0, 60), 99.0])
        ttfb = seconds * rng.random()
        out.append((route, method, status, cache, seconds, ttfb, rng.randrange(100_000)))
    return out


def test_tallies_flush_to_the_same_exposition_as_direct_updates() -> None:
    """Bulk-adding tallied buckets (prometheus-client has no bulk observe) gives what observing
    each request directly gives, so an upgrade of the pinned library that changed its internals
    fails here."""
    observed = Metrics(CollectorRegistry())
    observer = RequestObserver(observed, AccessLog(io.StringIO(), enabled=False))
    direct = Metrics(CollectorRegistry())
    for i, (route, method, status, cache, seconds, ttfb, nbytes) in enumerate(
        _observations(3, 3000)
    ):
        observer.observe(
            route=route,
            method=method,
            status=status,
            cache=cache,
            key=None,
            seconds=seconds,
            nbytes=nbytes,
            ttfb=None if i % 7 == 0 else ttfb,
        )
        observer.count_speech("tts-1", "alloy", "mp3", cache)
        direct.requests.labels(route, method, str(status)).inc()
        direct.request_seconds.labels(route, cache).observe(seconds)
        direct.time_to_first_byte.labels(route, cache).observe(seconds if i % 7 == 0 else ttfb)
        direct.response_bytes.labels(route).inc(nbytes)
        direct.speech_requests.labels("tts-1", "alloy", "mp3", cache).inc()
        if i == 1500:  # a collection in the middle flushes; the rest is tallied anew
            assert observed.registry.get_sample_value(
                "voxgate_http_requests_total",
                {"route": route, "method": method, "status": str(status)},
            )

    def lines(m: Metrics) -> list[str]:
        text = generate_latest(m.registry).decode()
        # _created timestamps differ between the two registries; everything else must not.
        return sorted(line for line in text.splitlines() if "_created" not in line)

    got, want = lines(observed), lines(direct)
    # Same series, same values; sums of floats only to rounding (they are added in another order).
    assert [line.rpartition(" ")[0] for line in got] == [line.rpartition(" ")[0] for line in want]
    for g, w in zip(got, want, strict=True):
        if not g.startswith("#"):
            assert math.isclose(
                float(g.rpartition(" ")[2]), float(w.rpartition(" ")[2]), rel_tol=1e-12
            ), g
    assert any(line.startswith("voxgate_http_request_duration_seconds_bucket") for line in got)


def test_flush_follows_a_request_and_close() -> None:
    """Without a collection, the observer flushes by itself soon after a request (multi-process
    scrapes read each process's files, not this registry), and its close flushes what is left."""

    async def main() -> None:
        m = Metrics(CollectorRegistry())
        observer = RequestObserver(m, AccessLog(io.StringIO(), enabled=False))
        observer.flush_after_s = 0.01
        flushed = asyncio.Event()
        m.before_collect(flushed.set)  # (runs after the observer's own flush, registered first)
        limits = KeyLimits(m)  # (its per-key counts are tallied too, and flushed with these)
        sample = m.speech_requests.labels("tts-1", "alloy", "wav", "hit")
        keyed = m.api_key_requests.labels("bot", "ok")
        observer.count_speech("tts-1", "alloy", "wav", "hit")
        limits.count("bot", "ok")
        assert keyed._value.get() == 0  # tallied, not yet added
        await asyncio.wait_for(flushed.wait(), 10)
        assert sample._value.get() == 1  # read directly: no collection ran
        assert keyed._value.get() == 1
        observer.count_speech("tts-1", "alloy", "wav", "hit")
        limits.count("bot", "ok")
        observer.close()
        assert sample._value.get() == 2
        assert keyed._value.get() == 2

    asyncio.run(main())


def test_observed_requests_become_access_log_lines_in_order() -> None:
    """Observations are kept as tuples and made into lines at the flush: each line carries its
    own request's fields and the time it was observed, in the order observed."""

    async def main() -> tuple[list[dict[str, object]], float, float]:
        stream = io.StringIO()
        log = AccessLog(stream, flush_interval_s=3600)
        observer = RequestObserver(Metrics(CollectorRegistry()), log)
        before = time.time()
        observer.observe("/v1/audio/speech", "POST", 200, "hit", "ab" * 32, 0.0012, 3000)
        observer.observe("/healthz", "GET", 404, "none", None, 0.5, 7, 0.25, 'a "b"')
        after = time.time()
        assert stream.getvalue() == ""  # nothing formatted or written per request
        observer.close()
        await log.close()
        return [json.loads(x) for x in stream.getvalue().splitlines()], before, after

    lines, before, after = asyncio.run(main())
    assert [(x["route"], x["method"], x["status"], x["cache"]) for x in lines] == [
        ("/v1/audio/speech", "POST", 200, "hit"),
        ("/healthz", "GET", 404, "none"),
    ]
    assert [(x["key"], x["ms"], x["bytes"], x["client"]) for x in lines] == [
        ("ab" * 32, 1.2, 3000, None),
        (None, 500.0, 7, 'a "b"'),
    ]
    for x in lines:
        stamp = datetime.datetime.fromisoformat(str(x["ts"])).timestamp()
        assert before - 0.001 <= stamp <= after
        assert x["msg"] == "request" and x["logger"] == "voxgate.access"
