"""A full synthesis queue turns new misses away with 503 + Retry-After; hits keep being served."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.runtime.settings import Settings
from metrics import Metrics
from tests.conftest import GatewayFactory
from tests.served import DefaultServer
from tests.support import CountingEngine, until

CACHED = {"model": "tts-1", "input": "Already cached.", "voice": "alloy", "response_format": "wav"}


def miss(i: int) -> dict[str, object]:
    return {**CACHED, "input": f"Uncached sentence number {i}."}


async def test_full_queue_503_while_hits_served(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine, metrics: Metrics
) -> None:
    client = await gateway(settings=settings.replace(queue_size=2, retry_after_s=3))
    warm = await client.post("/v1/audio/speech", json=CACHED)
    assert warm.status == 200
    counting_engine.release.clear()  # the engine now blocks: a deliberately stuck engine

    def sample(name: str) -> float:
        return metrics.registry.get_sample_value(name, {"model": "piper"}) or 0.0

    async def reaches(name: str, value: float) -> None:
        await until(lambda: sample(name) == value, 60, f"{name} == {value}")

    inflight: list[asyncio.Task[Any]] = []
    try:
        # One item running (blocked in the engine), then two queued: the queue is full. Each
        # step waits for the previous to land, so the order cannot race.
        inflight.append(asyncio.create_task(client.post("/v1/audio/speech", json=miss(0))))
        await reaches("voxgate_synthesis_busy_workers", 1.0)
        for i in (1, 2):
            inflight.append(asyncio.create_task(client.post("/v1/audio/speech", json=miss(i))))
            await reaches("voxgate_synthesis_queue_depth", float(i))
        rejected = await client.post("/v1/audio/speech", json=miss(99))
        assert rejected.status == 503
        assert rejected.headers["Retry-After"] == "3"
        err = (await rejected.json())["error"]
        assert "queue" in err["message"] and err["code"] == "queue_full"
        hit = await client.post("/v1/audio/speech", json=CACHED)
        assert hit.status == 200 and hit.headers["X-Cache"] == "HIT"
    finally:
        counting_engine.release.set()
    responses = await asyncio.gather(*inflight)
    assert [r.status for r in responses] == [200, 200, 200]
    assert (
        metrics.registry.get_sample_value("voxgate_synthesis_rejected_total", {"model": "piper"})
        == 1.0
    )


class HeldWarmUp(CountingEngine):
    """The real voice whose warm-up, too, waits for ``release``: the gateway stays unready for as
    long as the test holds it, however fast the voice warms."""

    def warm_up(self) -> None:
        self.release.wait()
        super().warm_up()


async def test_readyz_503_until_warm(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
) -> None:
    counting_engine.release.clear()
    slow = HeldWarmUp(counting_engine.inner)
    slow.release.clear()  # warm-up blocks
    try:
        client = await gateway(engines={"piper": slow}, wait_ready=False)
        r = await client.get("/readyz")
        assert r.status == 503
        assert (await r.json())["models"] == {"piper": False}
        r = await client.post("/v1/audio/speech", json=CACHED)
        assert r.status == 503 and "Retry-After" in r.headers
        slow.release.set()
        ready: list[int] = []

        async def readyz() -> int:
            ready.append((await client.get("/readyz")).status)
            return ready[-1]

        # The warm-up synthesis runs once released: ready when it is done (polled, up to 60 s).
        while await readyz() != 200:
            assert len(ready) < 1200, "not ready 60 s after the warm-up was released"
            await asyncio.sleep(0.05)
    finally:
        slow.release.set()
        counting_engine.release.set()


@pytest.mark.slow
async def test_serve_turns_misses_beyond_the_hosts_queue_away_with_503(tmp_path: Path) -> None:
    """`voxgate serve` as users start it (no topology flags): every gateway process hands its
    misses to the host's pool process at once, whose one queue holds `queue_size` per gateway
    process; a miss beyond it gets the lone server's 503 + Retry-After (`queue_full`), the others
    are answered, and the server keeps answering after. Sixteen long sentences (each seconds of
    engine time) arrive together: far more than the pool's slots and queue can take before the
    first is done."""
    server = DefaultServer(
        tmp_path / "srv",
        "--queue-size",
        "1",
        "--queue-per-client",
        "64",
        "--renders-per-client",
        "64",
    )
    try:
        server.wait_ready()
        clause = "please hold the line while we look up the details of your account"
        texts = [f"Caller {i}, {clause}, {clause}, and {clause}." for i in range(16)]
        answers = await asyncio.gather(
            *(
                server.request("POST", "/v1/audio/speech", json={**CACHED, "input": t})
                for t in texts
            )
        )
        statuses = [status for status, _, _ in answers]
        assert set(statuses) <= {200, 503}, statuses
        refused = [(headers, body) for status, headers, body in answers if status == 503]
        assert refused and statuses.count(200) >= 1, statuses
        for headers, body in refused:
            assert headers["Retry-After"] == "1"
            assert json.loads(body)["error"]["code"] == "queue_full"
        status, headers, _ = await server.request("POST", "/v1/audio/speech", json=CACHED)
        assert status == 200 and headers["X-Cache"] == "MISS"
    finally:
        server.close()
