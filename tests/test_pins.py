"""Pinned prompts: one list and one pin quota per host (every gateway process of `voxgate serve`)
and per cluster (every replica sharing Redis); a catalogue over its quota pins nothing; the
quota shows in `voxgate cache stats` and /metrics; only a catalogue pins."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import CACHE_SECRET, RedisServer
from cache.pins import (
    ANONYMOUS,
    LABEL_TEXT_CHARS,
    HostPinRegistry,
    PinItem,
    PinQuota,
    PinQuotaExceeded,
    encode_label,
)
from cache.tier import PurgeFilter
from gateway.http import keys
from gateway.runtime.apikeys import key_table
from gateway.runtime.settings import Settings
from gateway.runtime.topology import usable_cores
from gateway.speech.telephony import EXTENSIONS
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.ops_support import run_cli
from tests.served import DefaultServer
from tests.support import ToneEngine

MIB = 1024 * 1024
OPS_SECRET = canary("ops")
OPS2_SECRET = canary("ops2")
SPEAK_SECRET = canary("speak")
OPS = {"X-API-Key": OPS_SECRET}
OPS2 = {"X-API-Key": OPS2_SECRET}

# The tone engine's sizes are exact: "huge" is 10 s of tone per character. Measured charges
# (entry bytes + records + labels): SMALL 6 KB; HUGE 1.77 MB; HUGE_8K 1.43 MB; HUGE_ULAW 1.03 MB.
BEEP = {"voice": "beep", "response_format": "wav"}
SMALL = {"prompts": ["Hi.", "Bye."], "defaults": BEEP}
HUGE = {"prompts": [{"input": "huge", "id": "huge"}], "defaults": BEEP}
HUGE_8K = {"prompts": ["huge."], "defaults": {**BEEP, "sample_rate": 8000}}
HUGE_ULAW = {"prompts": ["huge!"], "defaults": {**BEEP, "response_format": "mulaw", "rate": 8000}}


def tone_gateway(gateway: GatewayFactory, settings: Settings) -> Any:
    # Quotas are measured with the tone engine's exact sizes, 10 s of tone a character for
    # "huge": a take the checks would rightly refuse, so they are off here (tests/test_takes.py
    # holds what they do).
    return gateway(settings=settings.replace(take_checks="off"), engines={"piper": ToneEngine()})


def metric(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


async def pinned_anywhere(http: TestClient[Any, Any], key: str) -> list[str]:
    """The tiers of ``http``'s gateway where ``key`` is stored pinned."""
    out = []
    for tier in http.app[keys.STORE].tiers:
        entry = await tier.get(key)
        if entry is not None and entry.meta.pinned:
            out.append(tier.name)
    return out


async def rendition_of(http: TestClient[Any, Any], prompt: str, **fields: Any) -> tuple[str, str]:
    """The content address of ``prompt``'s rendition and how it was had (asked as speech)."""
    body = {"model": "piper", "voice": "beep", "input": prompt, "response_format": "wav", **fields}
    r = await http.post("/v1/audio/speech", json=body, headers={"X-API-Key": SPEAK_SECRET})
    assert r.status == 200, await r.text()
    return r.headers["X-Audio-Key"], r.headers["X-Cache"]


async def nothing_pinned_of(http: TestClient[Any, Any], prompt: str, **fields: Any) -> None:
    """Neither ``prompt``'s rendition nor its masters are pinned in any tier (it is stored,
    as an ordinary entry: a refused catalogue's audio stays a cache entry)."""
    key, cache = await rendition_of(http, prompt, **fields)
    assert cache == "HIT"
    assert await pinned_anywhere(http, key) == []
    entry = http.app[keys.STORE].get_memory(key)
    assert entry is not None and entry.meta.parts
    for part in entry.meta.parts:
        assert await pinned_anywhere(http, part) == []


@pytest.fixture
def keyed(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "keys.toml"
    path.write_text(
        key_table("ops", OPS_SECRET, ["admin"])
        + key_table("ops2", OPS2_SECRET, ["admin"])
        + key_table("ivr", SPEAK_SECRET, ["speak"])
    )
    return settings.replace(api_keys_file=str(path))


# ---- one list for every gateway process of the host ---------------------------------------


def test_every_gateway_process_of_the_host_lists_the_same_pinned_prompts(tmp_path: Path) -> None:
    server = DefaultServer(tmp_path)  # as a user starts it: no topology flags
    try:
        server.wait_ready()
        assert server.gateways >= 2 or usable_cores() == 1
        # Open on loopback, as a laptop's gateway is: nothing to warn about.
        listening = [x for x in server.logs().splitlines() if "listening on" in x]
        assert listening and not any("beyond loopback" in x for x in listening)
        request = urllib.request.Request(
            server.url + "/v1/prompts",
            data=json.dumps(
                {"prompts": [{"input": "Press one.", "id": "one"}, "Goodbye."]}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as resp:
            summary = json.loads(resp.read())["summary"]
        assert summary["pinned_entries"] == 4 and summary["pinned_bytes"] > 0
        # Each call a new connection, which the kernel hands to any of the processes.
        lists = []
        for _ in range(12):
            status, body = server.get("/v1/prompts")
            assert status == 200
            lists.append(json.loads(body)["prompts"])
        assert all(listed == lists[0] for listed in lists), [len(x) for x in lists]
        assert [(p["id"], p["text"]) for p in lists[0]] == [
            ("one", "Press one."),
            (None, "Goodbye."),
        ]
        # The pinned bytes, against the quota, on /metrics and in `voxgate cache stats`.
        text = server.metrics()
        assert metric(text, "voxgate_pinned_bytes", key=ANONYMOUS) == summary["pinned_bytes"]
        assert metric(text, "voxgate_pinned_quota_bytes", scope="total") == 1024 * MIB
        stats = run_cli("cache", "stats", "--json", "--cache-dir", str(tmp_path / "cache"))
        assert stats.returncode == 0, stats.stderr
        (pins,) = [row for row in json.loads(stats.stdout) if row["tier"] == "pins"]
        assert pins["registry"] == "host"
        assert pins["pinned_bytes"] == summary["pinned_bytes"]
        assert pins["owners"] == {ANONYMOUS: summary["pinned_bytes"]}
        assert pins["quota_bytes"] == 1024 * MIB and pins["quota_per_key_bytes"] == 256 * MIB
        # A purge of the pins gives their bytes back.
        purged = run_cli(
            "cache", "purge", "--pinned", "--json", "--cache-dir", str(tmp_path / "cache")
        )
        assert purged.returncode == 0, purged.stderr
        assert json.loads(purged.stdout)["pins_released"] == 4
        status, body = server.get("/v1/prompts")
        assert status == 200 and json.loads(body)["prompts"] == []
        assert metric(server.metrics(), "voxgate_pinned_bytes", key=ANONYMOUS) == 0
    finally:
        server.close()


# ---- the quota -----------------------------------------------------------------------------


async def test_a_key_past_its_pin_quota_pins_nothing_and_another_key_has_its_own(
    gateway: GatewayFactory, keyed: Settings
) -> None:
    http = await tone_gateway(gateway, keyed.replace(pin_quota_mb_per_key=2))
    registry = http.app[keys.PINS]
    small = await (await http.post("/v1/prompts", json=SMALL, headers=OPS)).json()
    huge = await (await http.post("/v1/prompts", json=HUGE, headers=OPS)).json()
    charged = small["summary"]["pinned_bytes"] + huge["summary"]["pinned_bytes"]
    assert huge["summary"]["pinned_bytes"] > MIB  # the audio, its master and records
    assert (await registry.usage()).owners == {"ops": charged}
    listed = (await (await http.get("/v1/prompts", headers=OPS)).json())["prompts"]
    assert [p["text"] for p in listed] == ["Hi.", "Bye.", "huge"]

    refused = await http.post("/v1/prompts", json=HUGE_8K, headers=OPS)
    assert refused.status == 413
    err = (await refused.json())["error"]
    assert err["code"] == "pin_quota_exceeded" and err["param"] == "prompts"
    assert "pin_quota_mb_per_key = 2" in err["message"] and "'ops'" in err["message"]
    assert f"has {charged:,} of its {2 * MIB:,} bytes" in err["message"]
    needed = int(re.search(r"needs ([\d,]+) more bytes", err["message"])[1].replace(",", ""))  # type: ignore[index]
    assert charged + needed > 2 * MIB
    # Nothing of it pinned: no record, no listing, no pinned entry in any tier.
    assert (await registry.usage()).owners == {"ops": charged}
    assert (await (await http.get("/v1/prompts", headers=OPS)).json())["prompts"] == listed
    await nothing_pinned_of(http, "huge.", sample_rate=8000)

    # Another key has a quota of its own; what is pinned already costs it nothing.
    other = await http.post("/v1/prompts", json=HUGE_8K, headers=OPS2)
    assert other.status == 200, await other.text()
    assert (await other.json())["summary"]["pinned_bytes"] == needed
    again = await (await http.post("/v1/prompts", json=SMALL, headers=OPS2)).json()
    assert again["summary"]["pinned_bytes"] == 0 and again["summary"]["pinned_entries"] == 4
    assert (await registry.usage()).owners == {"ops": charged, "ops2": needed}
    text = await (await http.get("/metrics", headers=OPS)).text()
    assert metric(text, "voxgate_pinned_bytes", key="ops") == charged
    assert metric(text, "voxgate_pinned_bytes", key="ops2") == needed
    assert metric(text, "voxgate_pinned_quota_bytes", scope="per_key") == 2 * MIB
    assert metric(text, "voxgate_pins_refused_total", limit="per_key") == 1


async def test_without_keys_one_anonymous_owner_is_bounded_by_the_total(
    gateway: GatewayFactory, settings: Settings
) -> None:
    http = await tone_gateway(gateway, settings.replace(pin_quota_mb=2))
    assert (await http.post("/v1/prompts", json=HUGE)).status == 200
    refused = await http.post("/v1/prompts", json=HUGE_8K)
    assert refused.status == 413
    message = (await refused.json())["error"]["message"]
    assert "pin_quota_mb = 2" in message and f"of {2 * MIB:,} bytes are pinned in all" in message
    await nothing_pinned_of(http, "huge.", sample_rate=8000)
    usage = await http.app[keys.PINS].usage()
    assert list(usage.owners) == [ANONYMOUS] and usage.total < 2 * MIB


async def test_an_owner_with_no_room_left_is_refused_before_any_synthesis(
    gateway: GatewayFactory, settings: Settings
) -> None:
    http = await tone_gateway(gateway, settings.replace(pin_quota_mb=0))
    refused = await http.post("/v1/prompts", json=SMALL)
    assert refused.status == 413
    assert "pin_quota_mb = 0" in (await refused.json())["error"]["message"]
    body = {"model": "piper", "voice": "beep", "input": "Hi.", "response_format": "wav"}
    assert (await http.post("/v1/audio/speech", json=body)).headers["X-Cache"] == "MISS"


async def test_only_a_catalogue_pins_and_its_extensions_are_charged(
    gateway: GatewayFactory, settings: Settings
) -> None:
    http = await tone_gateway(gateway, settings)
    plain = await (await http.post("/v1/prompts", json=SMALL)).json()
    key = plain["prompts"][0]["key"]
    assert await pinned_anywhere(http, key) == ["memory", "disk"]
    # Another encoding fetched by URL is an ordinary entry, pinned source or not: a client
    # cannot grow what is pinned by asking for formats.
    assert (await http.get(f"/v1/audio/{key}.ulaw")).status == 200
    derived = http.app[keys.SPEECH].transcoder.known_key(key, EXTENSIONS["ulaw"])
    assert derived is not None and await pinned_anywhere(http, derived) == []
    # Asked for in the catalogue, it is pinned, and charged.
    with_ext = await (await http.post("/v1/prompts", json={**SMALL, "extensions": ["ulaw"]})).json()
    assert with_ext["summary"]["pinned_entries"] == 6
    assert with_ext["summary"]["pinned_bytes"] > 0
    assert await pinned_anywhere(http, derived) == ["memory", "disk"]
    assert with_ext["prompts"][0]["urls"] == {"ulaw": f"/v1/audio/{key}.ulaw"}


# ---- the registry ----------------------------------------------------------------------------


async def test_the_host_registry_is_one_for_every_process_and_refuses_whole(
    tmp_path: Path,
) -> None:
    # Two registries on one file stand for two gateway processes of a host.
    a = HostPinRegistry.in_cache_dir(tmp_path)
    b = HostPinRegistry.in_cache_dir(tmp_path)
    try:
        quota = PinQuota(total=10_000, per_owner=5_000)
        k1, k2, k3 = "1" * 64, "2" * 64, "3" * 64
        label = encode_label(k1, {"text": "Hello.", "id": None})
        assert await a.reserve("x", [PinItem(k1, 1000, "joe", "piper")], {k1: label}, quota) > 1000
        assert await b.listing() == [{"text": "Hello.", "id": None, "key": k1}]
        with pytest.raises(PinQuotaExceeded) as exc:
            await b.reserve("x", [PinItem(k2, 100), PinItem(k3, 4000)], {}, quota)
        assert exc.value.limit == "per_owner"
        assert (await a.usage()).owners == {"x": 1000 + 512 + len(label)}
        # Reserved again (by anyone): nothing more to charge.
        assert await b.reserve("y", [PinItem(k1, 1000)], {}, quota) == 0
        # A label that rotted on disk is never listed, and is deleted.
        label2 = encode_label(k2, {"text": "B."})
        await b.reserve("y", [PinItem(k2, 10)], {k2: label2}, quota)

        def rot() -> None:
            with sqlite3.connect(tmp_path / "pins.sqlite3") as db:
                db.execute("UPDATE labels SET label = x'0000000042' WHERE key = ?", (k2,))

        await asyncio.to_thread(rot)
        assert [p["key"] for p in await a.listing()] == [k1]
        # A purge by voice forgets its pins and gives their bytes back.
        assert await a.forget(PurgeFilter(voice="joe")) == 1
        assert (await b.usage()).owners == {"y": 10 + 512 + len(label2)}
        assert await a.forget(PurgeFilter(pinned=False)) == 0
        # Two processes racing for the last room: one gets it, the other pins nothing.
        wide = PinQuota(total=10_000)
        raced = await asyncio.gather(
            a.reserve("p", [PinItem("4" * 64, 6000)], {}, wide),
            b.reserve("q", [PinItem("5" * 64, 6000)], {}, wide),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in raced) == ["PinQuotaExceeded", "int"]
        assert (await a.usage()).total <= 10_000
    finally:
        await a.close()
        await b.close()


async def test_the_host_registry_is_readable_by_its_user_only_in_an_existing_directory(
    tmp_path: Path,
) -> None:
    # An operator's cache directory, open to other local users, made before voxgate ran, with a
    # registry an older version left readable by everyone.
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o755)
    cache_dir.chmod(0o755)
    old = cache_dir / "old"
    old.mkdir()
    (old / "pins.sqlite3").touch(mode=0o644)
    (old / "pins.sqlite3").chmod(0o644)
    for where in (cache_dir, old):
        registry = HostPinRegistry.in_cache_dir(where)
        try:
            k = "1" * 64
            label = encode_label(k, {"text": "A private prompt."})
            await registry.reserve("x", [PinItem(k, 10)], {k: label}, PinQuota(total=10_000))
            files = sorted(p.name for p in where.glob("pins.sqlite3*"))
            assert files == ["pins.sqlite3", "pins.sqlite3-shm", "pins.sqlite3-wal"]
            assert {oct(p.stat().st_mode & 0o777) for p in where.glob("pins.sqlite3*")} == {
                oct(0o600)
            }
        finally:
            await registry.close()


def test_a_label_keeps_the_first_characters_of_the_text() -> None:
    from gateway.speech.catalogue import PromptResult, prompt_label
    from gateway.speech.request import SpeechRequest
    from synth import audio

    req = SpeechRequest("a" * 5000, "piper", "joe", audio.FORMATS["wav"])
    label = prompt_label(req, PromptResult(0, "1" * 64, "miss", sample_rate=22050), "x")
    assert len(str(label["text"])) == LABEL_TEXT_CHARS
    assert len(encode_label("1" * 64, label)) < 8 * 1024


# ---- every replica sharing Redis -------------------------------------------------------------


async def test_replicas_sharing_redis_share_the_list_and_the_quota(
    gateway: GatewayFactory, settings: Settings, redis: RedisServer, tmp_path: Path
) -> None:
    shared = settings.replace(redis_url=redis.url, cache_secret=CACHE_SECRET, pin_quota_mb=2)
    one = await tone_gateway(gateway, shared)
    two = await tone_gateway(gateway, shared.replace(cache_dir=tmp_path / "other-host"))
    first = await (await one.post("/v1/prompts", json=HUGE_ULAW)).json()
    assert first["summary"]["pinned_bytes"] < 2 * MIB
    seen = [(await (await g.get("/v1/prompts")).json())["prompts"] for g in (one, two)]
    assert seen[0] == seen[1] and [p["text"] for p in seen[0]] == ["huge!"]

    client = aioredis.Redis.from_url(redis.url)
    try:

        async def pinned_redis_keys() -> int:
            n = 0
            async for name in client.scan_iter(match="voxgate:e:*"):
                n += int(await client.ttl(name) == -1)
            return n

        before = await pinned_redis_keys()
        assert before == 2  # the rendition and its master, without a TTL
        # Alone it would fit; with the other replica's pins it does not: nothing pinned.
        refused = await two.post("/v1/prompts", json=HUGE_8K)
        assert refused.status == 413, await refused.text()
        await two.app[keys.STORE].drain()
        assert await pinned_redis_keys() == before
        await nothing_pinned_of(two, "huge.", sample_rate=8000)

        # A label planted in Redis without the cache secret is never listed, and is deleted.
        labels, order = "voxgate:{pins}:label", "voxgate:{pins}:order"
        fake = "f" * 64
        planted = b"\0" * 32 + json.dumps({"key": fake, "text": "<script>"}).encode()
        await client.hset(labels, fake, planted)
        await client.zadd(order, {fake: 9e15})
        listed = (await (await two.get("/v1/prompts")).json())["prompts"]
        assert [p["text"] for p in listed] == ["huge!"]
        assert not await client.hexists(labels, fake)
    finally:
        await client.aclose()
    stats = run_cli(
        "cache",
        "stats",
        "--json",
        "--redis-url",
        redis.url,
        "--cache-secret",
        CACHE_SECRET,
        "--cache-dir",
        str(tmp_path / "cli"),
    )
    assert stats.returncode == 0, stats.stderr
    (pins,) = [row for row in json.loads(stats.stdout) if row["tier"] == "pins"]
    assert pins["registry"] == "redis"
    assert pins["owners"] == {ANONYMOUS: first["summary"]["pinned_bytes"]}


async def test_the_redis_registry_runs_on_a_cluster(tmp_path: Path) -> None:
    from cache.pins import RedisPinRegistry
    from cache.redis_tier import RedisTier
    from tests.redis_support import redis_cluster

    with redis_cluster(tmp_path / "cluster") as cluster:
        tier = RedisTier.from_url(cluster.url, secret=CACHE_SECRET.encode(), timeout_s=2.0)
        try:
            registry = RedisPinRegistry(tier)
            quota = PinQuota(total=50_000, per_owner=20_000)
            keys_ = [f"{n:064x}" for n in range(1, 4)]
            labels = {k: encode_label(k, {"text": f"Prompt {i}."}) for i, k in enumerate(keys_)}
            items = [PinItem(k, 1000, "joe", "piper") for k in keys_]
            charged = await registry.reserve("a", items, labels, quota)
            assert charged == sum(1000 + 512 + len(v) for v in labels.values())
            assert [p["text"] for p in await registry.listing()] == [
                "Prompt 0.",
                "Prompt 1.",
                "Prompt 2.",
            ]
            with pytest.raises(PinQuotaExceeded) as exc:
                await registry.reserve("a", [PinItem("e" * 64, 20_000)], {}, quota)
            assert exc.value.limit == "per_owner" and exc.value.owner_bytes == charged
            assert (await registry.usage()).owners == {"a": charged}
            assert await registry.forget(PurgeFilter(model="piper")) == 3
            assert (await registry.usage()).owners == {} and await registry.listing() == []
        finally:
            await tier.close()
