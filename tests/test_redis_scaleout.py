"""Replicas sharing one real Redis; Redis killed and restarted under load."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.harness import CACHE_SECRET, RedisServer, gateway_processes, metric_sum
from gateway.runtime.settings import Settings
from metrics import Metrics
from tests.conftest import GatewayFactory


def speech_body(text: str) -> dict[str, Any]:
    return {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "wav"}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


@pytest.mark.slow
def test_three_replicas_share_one_redis(tmp_path: Path, redis: RedisServer) -> None:
    """300 concurrent identical requests over 3 gateway processes: one synthesis in total, and
    exactly one response says MISS (not one per replica); the others
    waited for it (COALESCED) or found it stored (HIT).

    Redis calls get 5 s, not the default 0.5 s: a replica whose lock call or wait poll times out
    synthesizes alone, as it should, and with 100 requests on each replica, on a loaded
    machine's two cores, an event loop can be that late to read a reply."""
    slow_machine = ("--redis-timeout-ms", "5000")
    with gateway_processes(tmp_path, 3, redis_url=redis.url, args=slow_machine) as replicas:
        urls = [r.url for r in replicas]

        async def herd() -> list[tuple[int, bytes, str]]:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

                async def one(i: int) -> tuple[int, bytes, str]:
                    async with s.post(
                        urls[i % 3] + "/v1/audio/speech",
                        json=speech_body("Please hold, your call matters to us."),
                    ) as r:
                        return r.status, await r.read(), r.headers.get("X-Cache", "")

                return await asyncio.gather(*(one(i) for i in range(300)))

        results = asyncio.run(herd())
        assert [status for status, _, _ in results] == [200] * 300
        said = [cache for _, _, cache in results]
        assert said.count("MISS") == 1, {c: said.count(c) for c in set(said)}
        assert set(said) <= {"MISS", "COALESCED", "HIT"}
        texts = [scrape(u) for u in urls]
        syntheses = [metric_sum(t, "voxgate_syntheses_total", outcome="ok") for t in texts]
        redis_trouble = [
            (
                metric_sum(t, "voxgate_redis_errors_total"),
                metric_sum(t, "voxgate_redis_locks_total", result="bypassed"),
            )
            for t in texts
        ]
        assert sum(syntheses) == 1, (syntheses, redis_trouble)
        assert len({body for _, body, _ in results}) == 1
        # The hit-ratio metrics count them so (flushed within 0.1 s of a response: poll).
        deadline = time.monotonic() + 10
        while True:
            counted = {
                cache: sum(
                    metric_sum(scrape(u), "voxgate_speech_requests_total", cache=cache.lower())
                    for u in urls
                )
                for cache in ("MISS", "COALESCED", "HIT")
            }
            if counted == {c: said.count(c) for c in counted} or time.monotonic() > deadline:
                break
        assert counted == {c: said.count(c) for c in counted}

        # Text synthesized by A is a Redis-tier hit on B (B never saw it: not in its memory/disk).
        async def a_then_b() -> tuple[str, str, bytes, bytes]:
            async with aiohttp.ClientSession() as s:
                body = speech_body("Your account balance is ready.")
                async with s.post(urls[0] + "/v1/audio/speech", json=body) as ra:
                    a = ra.headers["X-Cache"], await ra.read()
                async with s.post(urls[1] + "/v1/audio/speech", json=body) as rb:
                    b = rb.headers["X-Cache"], await rb.read()
                return a[0], b[0], a[1], b[1]

        before = scrape(urls[1])
        cache_a, cache_b, audio_a, audio_b = asyncio.run(a_then_b())
        after = scrape(urls[1])
        assert (cache_a, cache_b) == ("MISS", "HIT")
        assert audio_a == audio_b
        lookups = "voxgate_cache_lookups_total"
        assert (
            metric_sum(after, lookups, tier="redis", result="hit")
            - metric_sum(before, lookups, tier="redis", result="hit")
        ) == 1
        assert (
            metric_sum(after, lookups, tier="disk", result="miss")
            - metric_sum(before, lookups, tier="disk", result="miss")
        ) >= 1
        assert metric_sum(after, "voxgate_syntheses_total", outcome="ok") == syntheses[1]


@pytest.mark.slow
async def test_redis_outage_fails_no_request_and_recovers(
    gateway: GatewayFactory, settings: Settings, metrics: Metrics, redis: RedisServer
) -> None:
    redis_settings = settings.replace(
        redis_url=redis.url,
        cache_secret=CACHE_SECRET,
        redis_timeout_ms=200,
        redis_breaker_failures=3,
        redis_breaker_reset_ms=500,
    )
    a = await gateway(settings=redis_settings)
    # B has no local tier at all: everything it serves from cache comes from Redis.
    b_metrics = Metrics()
    b = await gateway(
        settings=redis_settings.replace(memory_cache_mb=0, disk_cache_mb=0), metrics=b_metrics
    )
    hot = [f"Press {n} for more options." for n in range(4)]
    for text in hot:
        assert (await a.post("/v1/audio/speech", json=speech_body(text))).status == 200
    statuses: list[int] = []
    fresh = iter(range(10_000))

    async def load_round() -> None:
        calls = [a.post("/v1/audio/speech", json=speech_body(t)) for t in hot * 3]
        calls.append(a.post("/v1/audio/speech", json=speech_body(f"Ticket {next(fresh)}.")))
        calls.append(b.post("/v1/audio/speech", json=speech_body(hot[0])))
        for resp in await asyncio.gather(*calls):
            statuses.append(resp.status)
            await resp.read()

    for _ in range(2):
        await load_round()
    redis.stop()  # kill -9 in the middle of the load
    for _ in range(4):
        await load_round()
    assert statuses and set(statuses) == {200}
    assert (
        sum(s.value for s in metrics.redis_errors.collect()[0].samples if s.name.endswith("_total"))
        > 0
    )

    redis.start()  # same port, empty
    restarted = time.monotonic()
    while True:
        text = f"Welcome back, caller {next(fresh)}."
        assert (await a.post("/v1/audio/speech", json=speech_body(text))).status == 200
        resp = await b.post("/v1/audio/speech", json=speech_body(text))
        assert resp.status == 200
        if resp.headers["X-Cache"] == "HIT":
            break
        assert time.monotonic() - restarted < 30, "Redis tier not serving hits 30 s after restart"
        await asyncio.sleep(0.2)
    assert b_metrics.cache_lookups.labels("redis", "hit")._value.get() >= 1
