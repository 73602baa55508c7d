"""`voxgate audit` over a store seeded with real takes of the bundled voice, clean and bad
(silence, clipping, truncation, a rotten file): it finds exactly the bad ones, exits 1, and
`--evict` removes them, pinned ones only with `--evict-pinned`."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import CACHE_SECRET, RedisServer
from cache.disk import DiskTier
from cache.entry import Entry
from cache.pins import ANONYMOUS, HostPinRegistry, PinItem, PinQuota, encode_label
from cache.redis_tier import RedisTier
from gateway.runtime.settings import Settings
from synth import audio
from synth.engine import SynthesisItem
from synth.piper_engine import PiperEngine
from tests.ops_support import run_cli

TEXT = "The meeting starts at nine tomorrow morning, in the large room on the second floor."
MIB = 1024 * 1024


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def entry(pcm: np.ndarray[Any, Any], rate: int, fmt: str, *, pinned: bool = False) -> Entry:
    f = audio.FORMATS[fmt]
    if fmt == "flac":
        data = audio.master_of(pcm, rate)[1]
    else:
        out_rate = audio.output_rate(f, rate, None)
        data, rate = audio.render(pcm, rate, f, out_rate), out_rate
    return Entry.create(
        data,
        content_type=f.content_type,
        fmt=fmt,
        sample_rate=rate,
        model="piper",
        voice="joe",
        pinned=pinned,
        duration_s=pcm.size / rate,
    )


async def seed(cache_dir: Path, pcm: np.ndarray[Any, Any], rate: int) -> dict[str, Entry]:
    clipped = np.clip(pcm * 8, -1, 1).astype(np.float32)
    entries = {
        "clean master": entry(pcm, rate, "flac"),
        "clean mp3": entry(pcm, rate, "mp3"),
        "clean pinned ulaw": entry(pcm, rate, "ulaw", pinned=True),
        "silence": entry(np.zeros_like(pcm), rate, "flac"),
        "clipped": entry(clipped, rate, "wav"),
        "truncated pinned": entry(pcm[: pcm.size // 4], rate, "wav", pinned=True),
        "rotten": entry(pcm, rate, "wav"),
    }
    tier = await asyncio.to_thread(DiskTier, cache_dir, 64 * MIB)
    for name, e in entries.items():
        await tier.put(key(name), e)

    def rot() -> None:
        path = tier.path_of(key("rotten"))
        assert path is not None
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))

    await asyncio.to_thread(rot)
    await tier.close()
    # The pinned prompts' text, as the registry records it (what lets their length be judged).
    registry = await asyncio.to_thread(HostPinRegistry.in_cache_dir, cache_dir)
    pinned = [n for n in entries if "pinned" in n]
    await registry.reserve(
        ANONYMOUS,
        [PinItem(key(n), entries[n].size) for n in pinned],
        {key(n): encode_label(key(n), {"text": TEXT, "speed": 1.0}) for n in pinned},
        PinQuota(64 * MIB, None),
    )
    await registry.close()
    return entries


def audit(cache_dir: Path, *flags: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    done = run_cli("audit", "--cache-dir", str(cache_dir), *flags)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return done.returncode, {line["key"]: line for line in lines}, done.stderr


async def test_audit_finds_exactly_the_bad_entries_and_evicts_them(
    piper_engine: PiperEngine, tmp_path: Path
) -> None:
    # Piper samples noise (noise_scale, noise_w): off, the take is the same every run
    # (its first quarter, cut off, is then always too short, never too little speech to judge).
    quiet = {**piper_engine.default_params("joe"), "noise_scale": 0.0, "noise_w": 0.0}
    item = SynthesisItem(TEXT, "joe", params=quiet)
    (take,) = await asyncio.to_thread(piper_engine.synthesize_batch, [item])
    cache_dir = tmp_path / "cache"
    entries = await seed(cache_dir, take.pcm, take.sample_rate)
    names = {key(n): n for n in entries}
    bad = {"silence", "clipped", "truncated pinned", "rotten"}

    code, lines, err = await asyncio.to_thread(audit, cache_dir)
    assert code == 1, err
    assert "audit disk" in err  # the progress bar, on stderr
    assert {names[k] for k, v in lines.items() if v["verdict"] != "ok"} == bad
    assert len(lines) == len(entries)
    by_name = {names[k]: v for k, v in lines.items()}
    # The reasons the take checks give (synth/takecheck.py), each set whole.
    assert {name: set(by_name[name]["reasons"]) for name in entries} == {
        "clean master": set(),
        "clean mp3": set(),
        "clean pinned ulaw": set(),
        "silence": {"silent"},
        "clipped": {"clipped"},
        "truncated pinned": {"too_short"},
        "rotten": set(),
    }
    assert by_name["truncated pinned"]["text"] and not by_name["silence"]["text"]
    assert by_name["rotten"]["verdict"] == "corrupt"
    assert by_name["clean master"] | {"key": ""} == {
        "key": "",
        "tier": "disk",
        "text": False,
        "voice": "joe",
        "model": "piper",
        "verdict": "ok",
        "reasons": [],
        "pinned": False,
    }

    assert (await asyncio.to_thread(run_cli, "audit", "--evict-pinned")).returncode == 2

    code, lines, _ = await asyncio.to_thread(audit, cache_dir, "--evict")
    assert code == 1
    evicted = {names[k] for k, v in lines.items() if v.get("evicted")}
    assert evicted == bad - {"truncated pinned"}  # a pin stays without the confirmation
    code, lines, _ = await asyncio.to_thread(audit, cache_dir, "--evict", "--evict-pinned")
    assert code == 1 and {names[k] for k, v in lines.items() if v.get("evicted")} == {
        "truncated pinned"
    }
    code, lines, _ = await asyncio.to_thread(audit, cache_dir)
    assert code == 0 and {names[k] for k in lines} == set(entries) - bad
    # The evicted pin's record went with it; the clean pin's stayed.
    registry = await asyncio.to_thread(HostPinRegistry.in_cache_dir, cache_dir)
    listed = {names[str(p["key"])] for p in await registry.listing()}
    await registry.close()
    assert listed == {"clean pinned ulaw"}


async def test_audit_checks_the_redis_tier_and_trusts_nothing_unauthenticated(
    piper_engine: PiperEngine, redis: RedisServer, tmp_path: Path
) -> None:
    prefix = Settings.load(env={}).redis_prefix
    tier = RedisTier.from_url(redis.url, secret=CACHE_SECRET.encode(), prefix=prefix, timeout_s=5.0)
    # A real take of the bundled voice is the clean entry (a steady tone is rightly not speech).
    # Piper samples noise (noise_scale, noise_w): off, the take is the same every run.
    quiet = {**piper_engine.default_params("joe"), "noise_scale": 0.0, "noise_w": 0.0}
    item = SynthesisItem(TEXT, "joe", params=quiet)
    (take,) = await asyncio.to_thread(piper_engine.synthesize_batch, [item])
    pcm, rate = take.pcm, take.sample_rate
    await tier.put(key("clean"), entry(pcm, rate, "flac"))
    await tier.put(key("silence"), entry(np.zeros_like(pcm), rate, "flac"))
    # A value written without the cache secret: never decoded, reported corrupt.
    await tier.client.set(tier.entry_key(key("forged")), entry(pcm, rate, "wav").to_blob())
    names = {key(n): n for n in ("clean", "silence", "forged")}
    flags = ("--disk-cache-mb", "0", "--redis-url", redis.url, "--cache-secret", CACHE_SECRET)

    code, lines, err = await asyncio.to_thread(audit, tmp_path / "cache", *flags, "--evict")
    assert code == 1, err
    verdicts = {
        names[k]: (v["tier"], v["verdict"], set(v["reasons"]), v.get("evicted"))
        for k, v in lines.items()
    }
    assert verdicts == {
        "clean": ("redis", "ok", set(), None),
        "silence": ("redis", "bad", {"silent"}, True),
        "forged": ("redis", "corrupt", set(), True),
    }
    assert await tier.client.exists(tier.entry_key(key("clean"))) == 1
    assert await tier.client.exists(tier.entry_key(key("silence"))) == 0
    await tier.close()
