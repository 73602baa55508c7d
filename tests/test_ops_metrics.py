"""Operations in one process: /metrics after a mixed load passes promtool, every metric the
dashboard and the alert rules use is exported, readiness per tier, POST /v1/prompts."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cache.tier import TierError, TierStats
from gateway.http import keys
from gateway.runtime.settings import Settings
from metrics import (
    CacheMetrics,
    HttpMetrics,
    KeyMetrics,
    Metrics,
    SynthesisMetrics,
    UpstreamMetrics,
    WyomingMetrics,
)
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, small_file_system, until

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "ops" / "grafana-dashboard.json"
ALERTS = ROOT / "docs" / "ops" / "alerts.yml"
# Defined by the Redis tier's circuit breaker (another part of voxgate): checked once registered.
BREAKER = "voxgate_cache_breaker_state"

PROMTOOL = shutil.which("promtool")


def promtool() -> str:
    assert PROMTOOL is not None, "promtool missing: apt-get install -y prometheus"
    return PROMTOOL


def speech(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "wav", **kw}


async def mixed_load(client: Any) -> None:
    """Miss, hit, transcode, coalesced, bad requests, 404s, a catalogue, health and readiness."""
    assert (await client.post("/v1/audio/speech", json=speech("Mixed load one."))).status == 200
    assert (await client.post("/v1/audio/speech", json=speech("Mixed load one."))).status == 200
    transcode = await client.post(
        "/v1/audio/speech", json=speech("Mixed load one.", response_format="mp3")
    )
    assert transcode.status == 200
    same = await asyncio.gather(
        *(client.post("/v1/audio/speech", json=speech("Mixed load two.")) for _ in range(3))
    )
    assert {r.headers["X-Cache"] for r in same} >= {"MISS"}
    assert (await client.post("/v1/audio/speech", json={"input": "x"})).status == 400
    assert (await client.post("/v1/audio/speech", json=speech("y", speed=9))).status == 400
    assert (await client.get("/v1/audio/" + "0" * 64)).status == 404
    assert (await client.get("/nowhere")).status == 404
    assert (await client.post("/v1/prompts", json={"prompts": ["Mixed load three."]})).status == 200
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200


def exported_names(text: str) -> set[str]:
    """Metric family names declared in an exposition, plus every sample name."""
    names = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    names |= set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))
    # A histogram declared without a sample yet (a labelled one no label set has used, such as
    # an upstream's on a gateway without upstreams) still exports its series' names.
    for family in re.findall(r"^# TYPE (\S+) histogram$", text, re.M):
        names |= {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
    return names


def used_names() -> set[str]:
    """voxgate_* names in the dashboard's queries and the alert rules' expressions."""
    exprs: list[str] = []
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        exprs.extend(t["expr"] for t in panel.get("targets", []))
    for var in dash.get("templating", {}).get("list", []):
        if isinstance(var.get("query"), str):
            exprs.append(var["query"])
        elif isinstance(var.get("query"), dict):
            exprs.append(var["query"].get("query", ""))
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        exprs.extend(r["expr"] for r in group["rules"])
    return {n for e in exprs for n in re.findall(r"\bvoxgate_[a-z0-9_]+", e)}


def test_every_group_is_whole_on_its_own_and_no_two_share_a_name() -> None:
    """Metrics is its groups side by side: a member name in two groups would leave one of
    them registered but out of reach."""
    from prometheus_client import CollectorRegistry

    groups = (HttpMetrics, CacheMetrics, SynthesisMetrics, UpstreamMetrics, KeyMetrics)
    members = [vars(group(CollectorRegistry())) for group in (*groups, WyomingMetrics)]
    every = {k: v for k, v in vars(Metrics()).items() if k not in ("registry", "_before_collect")}
    assert sum(map(len, members)) == len(every)
    for group in members:
        assert {k: v._name for k, v in group.items()} == {k: every[k]._name for k in group}


async def test_metrics_after_mixed_load_pass_promtool(gateway: GatewayFactory) -> None:
    client = await gateway()
    await mixed_load(client)
    text = await (await client.get("/metrics")).text()
    check = await asyncio.to_thread(
        subprocess.run,
        [promtool(), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # The operations metrics are there and moved.
    assert re.search(r'^voxgate_build_info\{python="[\d.]+",version="[^"]+"\} 1\.0$', text, re.M)
    ttfb = re.search(
        r'^voxgate_time_to_first_byte_seconds_count\{cache="miss",route="/v1/audio/speech"\} (\S+)',
        text,
        re.M,
    )
    assert ttfb is not None and float(ttfb.group(1)) >= 2
    sent = re.search(
        r'^voxgate_http_response_bytes_total\{route="/v1/audio/speech"\} (\S+)', text, re.M
    )
    assert sent is not None and float(sent.group(1)) > 10_000
    assert re.search(r'^voxgate_catalogue_prompts_total\{result="miss"\} 1\.0$', text, re.M)
    # Labels come from bounded sets: no text, no key ever appears as a label value.
    assert "Mixed load" not in text
    assert not re.search(r'="[0-9a-f]{64}"', text)


def test_alert_rules_pass_promtool() -> None:
    check = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout


async def test_every_dashboard_and_alert_metric_is_exported(gateway: GatewayFactory) -> None:
    client = await gateway()
    await mixed_load(client)
    text = await (await client.get("/metrics")).text()
    used = used_names()
    assert len(used) >= 10
    # Histograms are used through their _bucket/_sum/_count series, counters with _total.
    missing = {n for n in used if n not in exported_names(text)}
    # The Redis breaker gauge belongs to the Redis tier; once Metrics registers it, it must be
    # exported like every other name (the check tightens itself).
    if BREAKER not in exported_names(_fresh_exposition()):
        missing.discard(BREAKER)
    assert not missing, f"dashboard/alerts use metrics /metrics does not export: {missing}"


def _fresh_exposition() -> str:
    from metrics import exposition

    return exposition(Metrics().registry).decode()


async def test_readyz_reports_each_tier_and_degraded_tier_keeps_serving(
    gateway: GatewayFactory,
) -> None:
    client = await gateway()
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 200
    assert body["status"] == "ready"
    assert body["models"] == {"piper": True}
    assert body["tiers"]["memory"]["state"] == "ok"
    assert body["tiers"]["disk"]["state"] == "ok"

    disk = client.app[keys.STORE].tiers[1]

    async def broken_stats() -> TierStats:
        raise TierError("disk tier: OSError: read-only file system")

    disk.stats = broken_stats  # type: ignore[method-assign]
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 200  # degraded but serving
    assert body["status"] == "degraded"
    assert body["tiers"]["disk"]["state"] == "degraded"
    assert "read-only" in body["tiers"]["disk"]["error"]
    assert body["tiers"]["memory"]["state"] == "ok"
    assert (await client.get("/healthz")).status == 200


async def test_readyz_says_when_a_full_disk_made_the_tier_evict(
    gateway: GatewayFactory,
    settings: Settings,
    metrics: Metrics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk under cache_dir fills long before disk_cache_mb: entries are evicted to store
    new ones (counted, a field of /readyz); with nothing left to evict the tier is degraded,
    the gateway still ready and answering."""
    cache_dir = Path(settings.cache_dir)
    files = small_file_system(monkeypatch, cache_dir, 300_000)
    client = await gateway()

    def evicted() -> float:
        value = metrics.registry.get_sample_value(
            "voxgate_cache_space_evictions_total", {"tier": "disk"}
        )
        return value or 0.0

    for i in range(8):
        text = f"Sentence number {i} fills a small disk with its audio."
        assert (await client.post("/v1/audio/speech", json=speech(text))).status == 200
    await until(lambda: evicted() > 0, 30, "an eviction for space")
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 200 and body["status"] == "ready"
    disk = body["tiers"]["disk"]
    assert disk["state"] == "ok" and disk["evicted_for_space"] == evicted()
    assert "full" not in disk
    assert sum(p.stat().st_size for p in files()) <= 300_000

    (cache_dir / "hog.val").write_bytes(bytes(300_000))
    writes = {"tier": "disk", "result": "error"}
    before = metrics.registry.get_sample_value("voxgate_cache_writes_total", writes) or 0.0
    resp = await client.post("/v1/audio/speech", json=speech("Nothing can be stored now."))
    assert resp.status == 200
    await until(
        lambda: (
            (metrics.registry.get_sample_value("voxgate_cache_writes_total", writes) or 0) > before
        ),
        30,
        "a failed disk write",
    )
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 200 and body["status"] == "degraded"
    assert body["tiers"]["disk"]["state"] == "degraded" and body["tiers"]["disk"]["full"] is True
    assert body["models"] == {"piper": True}


async def test_post_prompts_renders_pins_and_returns_addresses(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    body = {
        "defaults": {"response_format": "wav"},
        "prompts": [
            "Welcome to the line.",
            {"input": "Press one.", "response_format": "mulaw", "sample_rate": 8000},
            {"text": "Press two.", "format": "flac"},
        ],
    }
    resp = await client.post("/v1/prompts", json=body)
    assert resp.status == 200, await resp.text()
    out = await resp.json()
    assert [p["cache"] for p in out["prompts"]] == ["miss", "miss", "miss"]
    assert out["summary"]["synthesized"] == 3
    assert [p["format"] for p in out["prompts"]] == ["wav", "mulaw", "flac"]
    assert out["prompts"][1]["sample_rate"] == 8000
    for p in out["prompts"]:
        got = await client.get(f"/v1/audio/{p['key']}")
        assert got.status == 200
        assert len(await got.read()) == p["bytes"]
    stats = {s.name: s for s in await client.app[keys.STORE].stats()}
    assert stats["disk"].pinned >= 3
    again = await (await client.post("/v1/prompts", json=body)).json()
    assert [p["cache"] for p in again["prompts"]] == ["hit", "hit", "hit"]
    assert [p["key"] for p in again["prompts"]] == [p["key"] for p in out["prompts"]]
    assert counting_engine.items == 3


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({}, "prompts", "non-empty list"),
        ({"prompts": []}, "prompts", "non-empty list"),
        ({"prompts": "hello"}, "prompts", "non-empty list"),
        ({"prompts": ["ok", 3]}, "prompts[1]", "string or an object"),
        ({"prompts": ["ok", {"input": "x", "voice": "nobody"}]}, "prompts[1].voice", "voice"),
        ({"prompts": ["ok", {"input": "  "}]}, "prompts[1].input", "empty"),
        ({"prompts": [{"input": "x", "colour": "red"}]}, "prompts", "colour"),
        ({"prompts": ["a"] * 6}, "prompts", "limit is 5"),
        ({"prompts": ["a"], "extra": 1}, "extra", "unrecognized"),
        ({"prompts": ["a"], "defaults": {"tone": "warm"}}, "defaults", "unknown field 'tone'"),
        ({"prompts": ["a"], "defaults": []}, "defaults", "must be an object"),
    ],
)
async def test_post_prompts_rejects_bad_input(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    settings: Any,
    body: dict[str, Any],
    param: str,
    fragment: str,
) -> None:
    client = await gateway(settings=settings.replace(max_catalogue_prompts=5))
    resp = await client.post("/v1/prompts", json=body)
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["param"] == param
    assert fragment in err["message"]
    assert counting_engine.items == 0  # nothing rendered when any prompt is invalid


async def test_bad_requests_are_counted_by_endpoint_and_reason(
    gateway: GatewayFactory, metrics: Metrics
) -> None:
    client = await gateway()

    def count(endpoint: str, reason: str) -> float:
        value = metrics.registry.get_sample_value(
            "voxgate_bad_requests_total", {"endpoint": endpoint, "reason": reason}
        )
        return value or 0.0

    def every_count() -> dict[tuple[str, str], float]:
        return {
            (s.labels["endpoint"], s.labels["reason"]): s.value
            for metric in metrics.registry.collect()
            if metric.name == "voxgate_bad_requests"
            for s in metric.samples
            if s.name == "voxgate_bad_requests_total"
        }

    good = {"model": "tts-1", "input": "Counted.", "voice": "alloy"}
    assert (await client.post("/v1/audio/speech", json=good)).status == 200
    assert (await client.get("/v1/audio/" + "0" * 64)).status == 404
    # A well-formed key with nothing stored under it is a 404 caused by the input.
    assert count("/v1/audio/{key}", "not_found") == 1
    assert count("/v1/audio/speech", "invalid") == 0
    assert (await client.post("/v1/audio/speech", json={**good, "speed": 9})).status == 400
    assert (await client.post("/v1/audio/speech", json={**good, "voice": "nobody"})).status == 400
    assert (await client.post("/v1/audio/speech", json={**good, "input": "a" * 5000})).status == 400
    assert (await client.get("/v1/audio/speech")).status == 405
    assert (await client.get("/api/tts", params={"text": "x", "emotion": "y"})).status == 400
    assert count("/v1/audio/speech", "invalid") == 1
    assert count("/v1/audio/speech", "voice_not_found") == 1
    assert count("/v1/audio/speech", "input_too_long") == 1
    assert count("/v1/audio/speech", "method_not_allowed") == 1
    assert count("/api/tts", "invalid") == 1
    # A good request moves nothing; a 5xx or a 2xx is never counted.
    before = every_count()
    assert (await client.post("/v1/audio/speech", json=good)).status == 200
    after = every_count()
    assert after == before


def test_the_take_rejection_alert_fires_on_a_provider_answering_silence(tmp_path: Path) -> None:
    """promtool's rule unit test (``promtool test rules``, Prometheus' documented format for
    alerting-rule tests): a provider whose every take is refused (three takes a minute, each
    silent) fires ``VoxgateTakesRejected`` after its ``for``; a model whose takes pass, or
    refused only once, stays quiet."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rule = next(r for g in groups for r in g["rules"] if r.get("alert") == "VoxgateTakesRejected")
    rules = tmp_path / "takes_test.yml"
    rules.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(ALERTS)],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [
                            {
                                "series": 'voxgate_takes_total{instance="a",model="openai",'
                                'verdict="rejected",reason="silent"}',
                                "values": "0+3x40",
                            },
                            {
                                "series": 'voxgate_takes_total{instance="a",model="piper",'
                                'verdict="accepted",reason=""}',
                                "values": "0+20x40",
                            },
                            {
                                "series": 'voxgate_takes_total{instance="a",model="piper",'
                                'verdict="rejected",reason="too_short"}',
                                "values": "0+0x20 1+0x20",
                            },
                        ],
                        "alert_rule_test": [
                            {
                                "eval_time": "5m",
                                "alertname": "VoxgateTakesRejected",
                                "exp_alerts": [],
                            },
                            {
                                "eval_time": "30m",
                                "alertname": "VoxgateTakesRejected",
                                "exp_alerts": [
                                    {
                                        "exp_labels": {
                                            "severity": "warning",
                                            "instance": "a",
                                            "model": "openai",
                                        },
                                        "exp_annotations": {
                                            "summary": "voxgate refuses 100% of openai's new "
                                            "takes on a",
                                            "description": rule["annotations"]["description"],
                                        },
                                    }
                                ],
                            },
                        ],
                    }
                ],
            }
        )
    )
    run = subprocess.run(
        [promtool(), "test", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
