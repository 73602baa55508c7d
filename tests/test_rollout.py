"""``voxgate rollout MODEL --revision N``: every pinned prompt of a model re-rendered at a new
address revision beside the old audio, the model switched only once all are, and the switch
kept in the pin registry, so every gateway sharing it (replicas, a restart) serves the new
addresses.

The upstream is the local provider of tests/upstream_support.py, which follows OpenAI's
published speech contract (the module cites the document); the rollout runs as the command
runs it (:func:`gateway.cli.rollout.run_rollout`: its own speech service and registry, the
gateways untouched) in this process, so the provider's calls can be held and counted.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from bench.harness import CACHE_SECRET, RedisServer
from cache.pins import HostPinRegistry
from gateway.cli.main import build_parser
from gateway.cli.rollout import run_rollout
from gateway.http import keys
from gateway.runtime.settings import Settings
from synth.upstream import UpstreamConfig
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, eventually, until
from tests.upstream_support import KEY_ENV, RATE, OpenAISpeechServer, Scripted, voiced

PROMPTS = ["Thank you for calling.", "Please hold.", "Goodbye now."]


def upstream(server: OpenAISpeechServer) -> UpstreamConfig:
    return UpstreamConfig(
        name="openai",
        kind="openai",
        base_url=server.url,
        api_key_env=KEY_ENV,
        model="gpt-4o-mini-tts",
        voices=("alloy",),
        timeout_s=5,
        max_retries=0,
    )


@pytest.fixture
def engines(counting_engine: CountingEngine, provider: OpenAISpeechServer) -> dict[str, Any]:
    """The joe voice, and the local provider as the upstream ``openai``."""
    return {"piper": counting_engine, "openai": upstream(provider)}


def args(model: str, revision: str, concurrency: int | None = None) -> argparse.Namespace:
    """What ``voxgate rollout MODEL --revision N`` parses into (the parser itself stats files:
    it is checked apart, off the event loop)."""
    return argparse.Namespace(
        model=model,
        revision=revision,
        concurrency=concurrency,
        allow_unrenderable=False,
        json=True,
        quiet=True,
    )


async def pin_prompts(client: Any, model: str, voice: str) -> dict[str, str]:
    """Pin PROMPTS through POST /v1/prompts; their content addresses by text."""
    body = {
        "prompts": [
            {"input": t, "id": f"p{i}", "model": model, "voice": voice, "response_format": "wav"}
            for i, t in enumerate(PROMPTS)
        ]
    }
    r = await client.post("/v1/prompts", json=body)
    assert r.status == 200, await r.text()
    results = (await r.json())["prompts"]
    return {PROMPTS[x["index"]]: x["key"] for x in results}


async def key_of(client: Any, text: str, model: str = "openai", voice: str = "alloy") -> str:
    body = {"model": model, "input": text, "voice": voice, "response_format": "wav"}
    r = await client.post("/v1/audio/speech", json=body)
    assert r.status == 200, await r.text()
    assert r.headers["X-Cache"] == "HIT"
    return str(r.headers["X-Audio-Key"])


async def test_rollout_renders_all_beside_the_old_then_switches_every_gateway(
    gateway: GatewayFactory,
    engines: dict[str, Any],
    provider: OpenAISpeechServer,
    settings: Settings,
) -> None:
    live = settings.replace(revision_refresh_s=0.05)
    a = await gateway(settings=live, engines=engines)
    old = await pin_prompts(a, "openai", "alloy")
    assert provider.calls == 3
    # The rollout's calls are held: meanwhile every request gets the old audio, no call.
    provider.hold.clear()
    task = asyncio.ensure_future(run_rollout(settings, args("openai", "2"), engines))
    await until(lambda: len(provider.bodies) >= 4, 30, "the rollout asking the provider")
    for text in PROMPTS:
        assert await key_of(a, text) == old[text]
    assert not task.done()
    provider.hold.set()
    report = await task
    assert report["switched"] and report["rendered"] == 3 and report["failed"] == 0
    assert provider.calls == 6  # each prompt asked once more, at its new address
    changes = {c["text"]: c for c in report["changes"]}
    for text in PROMPTS:
        change = changes[text]
        assert change["old_key"] == old[text] and change["new_key"] != old[text]
        # Durations compared: the provider's voice did not change here, so neither did they.
        assert change["old_duration_s"] == pytest.approx(len(voiced(text)) / RATE, abs=0.01)
        assert change["change_s"] == pytest.approx(0.0, abs=0.002)
    # The running gateway reads the switch (revision_refresh_s) and serves the new audio as
    # hits: rendered and pinned by the rollout, no call.
    new = {t: str(changes[t]["new_key"]) for t in PROMPTS}

    async def served() -> dict[str, str]:
        return {t: await key_of(a, t) for t in PROMPTS}

    await eventually(served, lambda keys: keys == new, 30, "the switch read by gateway a")
    assert provider.calls == 6
    # Another gateway on the same registry (a restart, a replica of the host) starts at it.
    b = await gateway(settings=settings.replace(revision_refresh_s=0), engines=engines)
    assert {t: await key_of(b, t) for t in PROMPTS} == new
    assert provider.calls == 6
    registry = HostPinRegistry.in_cache_dir(settings.cache_dir)
    try:
        table = await registry.revisions()
    finally:
        await registry.close()
    assert [(m, r) for (m, _), r in table.items()] == [("openai", "2")]
    # Running it again is a no-op.
    again = await run_rollout(settings, args("openai", "2"), engines)
    assert again["switched"] and again["reason"] == "already at revision 2"
    assert provider.calls == 6


async def test_an_interrupted_rollout_resumed_renders_only_the_rest(
    gateway: GatewayFactory,
    engines: dict[str, Any],
    provider: OpenAISpeechServer,
    settings: Settings,
) -> None:
    a = await gateway(settings=settings.replace(revision_refresh_s=0), engines=engines)
    old = await pin_prompts(a, "openai", "alloy")
    # The provider fails one call: that prompt is not rendered, nothing is switched.
    provider.script.append(Scripted(503, "The engine is currently overloaded"))
    first = await run_rollout(settings, args("openai", "2", concurrency=1), engines)
    assert not first["switched"] and first["failed"] == 1 and first["rendered"] == 2
    assert "stays at revision (none)" in first["reason"]
    assert provider.calls == 3 + 3
    b = await gateway(settings=settings.replace(revision_refresh_s=0), engines=engines)
    assert {t: await key_of(b, t) for t in PROMPTS} == old  # still the old audio
    # Resumed: only the failed prompt is asked again; then the switch.
    second = await run_rollout(settings, args("openai", "2"), engines)
    assert second["switched"] and second["rendered"] == 1 and second["already"] == 2
    assert provider.calls == 3 + 3 + 1
    # The old audio of each prompt is still the one reported, not the earlier run's new one.
    for change in second["changes"]:
        assert change["old_key"] == old[change["text"]]
    c = await gateway(settings=settings.replace(revision_refresh_s=0), engines=engines)
    new = {t: await key_of(c, t) for t in PROMPTS}
    assert all(new[t] != old[t] for t in PROMPTS)
    assert provider.calls == 7


async def test_a_local_model_rolls_out_under_its_engines_fingerprint(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    settings: Settings,
) -> None:
    """A local model's revision belongs to the fingerprint the rollout ran with: gateways with
    that engine switch; one whose voice files differ (another fingerprint) keeps its
    addresses."""
    plain = settings.replace(revision_refresh_s=0)
    a = await gateway(settings=plain)
    old = await pin_prompts(a, "piper", "joe")
    synthesized = counting_engine.items
    report = await run_rollout(settings, args("piper", "b"), {"piper": counting_engine})
    assert report["switched"] and report["rendered"] == 3
    assert counting_engine.items == synthesized + 3
    b = await gateway(settings=plain)
    new = {t: await key_of(b, t, "piper", "joe") for t in PROMPTS}
    assert all(new[t] != old[t] for t in PROMPTS)
    assert counting_engine.items == synthesized + 3
    # A gateway whose joe has other files (another fingerprint): not switched.
    other = CountingEngine(counting_engine.inner)
    other.fingerprint = "f" * 64
    c = await gateway(settings=plain, engines={"piper": other})
    r = await c.post(
        "/v1/audio/speech",
        json={"model": "piper", "input": PROMPTS[0], "voice": "joe", "response_format": "wav"},
    )
    assert r.status == 200 and r.headers["X-Audio-Key"] not in (old[PROMPTS[0]], new[PROMPTS[0]])


def test_the_command_line_of_a_rollout() -> None:
    argv = ["rollout", "openai", "--revision", "2", "--json", "--quiet"]
    parsed = vars(build_parser().parse_args(argv))
    assert {k: parsed[k] for k in vars(args("openai", "2"))} == vars(args("openai", "2"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rollout", "openai"])


async def test_with_redis_the_switch_is_every_replicas_and_a_planted_one_is_ignored(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    settings: Settings,
    redis: RedisServer,
    tmp_path: Path,
) -> None:
    """With Redis the revision lives beside the pins in Redis, authenticated as they are: a
    replica on another host (another cache directory) starts at the switched revision, and a
    revision written into Redis without the cache secret is never applied."""
    shared = settings.replace(redis_url=redis.url, cache_secret=CACHE_SECRET, revision_refresh_s=0)
    engines = {"piper": counting_engine, "openai": upstream(provider)}
    a = await gateway(settings=shared, engines=engines)
    old = await pin_prompts(a, "openai", "alloy")
    report = await run_rollout(shared, args("openai", "7"), engines)
    assert report["switched"] and report["rendered"] == 3
    new = {c["text"]: c["new_key"] for c in report["changes"]}
    # A replica of another host: nothing of this one's disk, the switch read from Redis.
    b = await gateway(settings=shared.replace(cache_dir=tmp_path / "b"), engines=engines)
    assert {t: await key_of(b, t) for t in PROMPTS} == new
    assert provider.calls == 6
    # A revision planted in Redis (no valid HMAC) for the local model: not applied.
    client = aioredis.Redis.from_url(redis.url)
    try:
        names = [k async for k in client.scan_iter(match="*{pins}:rev")]
        assert len(names) == 1
        field = f"piper\n{counting_engine.fingerprint}"
        await client.hset(names[0], field, b"\0" * 32 + b"evil")
    finally:
        await client.aclose()
    c = await gateway(settings=shared.replace(cache_dir=tmp_path / "c"), engines=engines)
    assert c.app[keys.SPEECH].revision_of("piper") == ""
    assert c.app[keys.SPEECH].revision_of("openai") == "7"
    assert all(old[t] != new[t] for t in PROMPTS)
