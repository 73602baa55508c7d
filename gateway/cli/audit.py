"""``voxgate audit``: run the take checks over the stored audio (docs/takes-review.md)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from cache.entry import CorruptEntry, Entry
from gateway.cli.common import (
    EXIT_FAILED,
    STORE_SETTINGS,
    Refused,
    add_setting_flags,
    command,
    run,
)
from gateway.runtime.settings import Settings
from synth import audio
from synth.takecheck import Limits, TakeChecker, TakeFacts, Verdict

# The reasons only a take's text can give: skipped for an entry whose text is not known.
TEXT_REASONS = frozenset({"too_short", "too_long", "speed_ignored", "asr_mismatch"})
_RAW = {"ulaw": "ULAW", "alaw_raw": "ALAW", "alaw-raw": "ALAW", "gsm": "GSM610"}
_AV = {"aac": "aac", "g722": "g722"}


def decode_entry(entry: Entry) -> tuple[audio.FloatPCM, int]:
    """Mono float PCM of a stored entry in its format: a master (FLAC) or any rendition;
    :class:`audio.UndecodableAudio` when its bytes are not that."""
    import soundfile as sf

    meta = entry.meta
    if meta.format == "pcm":
        pcm = np.frombuffer(entry.audio[: len(entry.audio) // 2 * 2], dtype="<i2")
        return pcm.astype(np.float32) / np.float32(32768.0), meta.sample_rate
    if meta.format in _RAW:
        try:
            raw, rate = sf.read(
                io.BytesIO(entry.audio),
                dtype="float32",
                format="RAW",
                subtype=_RAW[meta.format],
                samplerate=meta.sample_rate,
                channels=1,
            )
        except (sf.LibsndfileError, RuntimeError, ValueError) as exc:
            raise audio.UndecodableAudio(f"{meta.format} does not decode") from exc
        return np.asarray(raw, dtype=np.float32), int(rate)
    if meta.format in _AV:
        return _decode_av(entry.audio, _AV[meta.format])
    return audio.decode_master(entry.audio)  # WAV, FLAC, MP3, Ogg: what libsndfile reads


def _decode_av(data: bytes, container: str) -> tuple[audio.FloatPCM, int]:
    import av

    chunks: list[np.ndarray[Any, Any]] = []
    rate = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=container) as box:
            resampler = av.AudioResampler(format="flt", layout="mono")
            for frame in box.decode(audio=0):
                rate = frame.sample_rate
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
    except (av.FFmpegError, ValueError) as exc:
        raise audio.UndecodableAudio(f"{container} does not decode") from exc
    if not chunks or rate <= 0:
        raise audio.UndecodableAudio(f"{container}: no audio")
    return np.concatenate(chunks).astype(np.float32), rate


@dataclass(frozen=True)
class Said:
    """What a pinned prompt said: its whole text and speed (the registry's record)."""

    text: str
    speed: float


def check_entry(checker: TakeChecker, entry: Entry, said: Said | None) -> Verdict:
    """The take checks on a stored entry (CPU work: run it off the loop)."""
    try:
        pcm, rate = decode_entry(entry)
    except audio.UndecodableAudio:
        return Verdict(("not_audio",))
    facts = TakeFacts(
        pcm=pcm,
        sample_rate=rate,
        text=said.text if said else "",
        speed=said.speed if said else 1.0,
        voice=f"{entry.meta.model}/{entry.meta.voice}",
        pause_s=sum(entry.meta.gaps_ms) / 1000
        if entry.meta.gaps_ms
        else entry.meta.pause_ms / 1000 * len(entry.meta.parts[1:]),
    )
    return checker.check(facts, Limits() if said else Limits(skip=TEXT_REASONS))


async def _said(settings: Settings, tiers: list[Any]) -> dict[str, Said]:
    """Each pinned prompt's text and speed by key, where the registry kept them whole."""
    from cache.pins import PinRegistryError, registry_for

    registry = registry_for(tiers, settings.cache_dir)
    try:
        listing = await registry.listing()
    except PinRegistryError as exc:
        print(f"voxgate audit: pin registry unreadable, no text checks: {exc}", file=sys.stderr)
        return {}
    finally:
        await registry.close()
    said = {}
    for item in listing:
        text, key, speed = item.get("text"), item.get("key"), item.get("speed", 1.0)
        if item.get("cut") or item.get("ssml") or not isinstance(text, str):
            continue  # only part of the text, or SSML's words without its breaks
        if isinstance(key, str) and type(speed) in (int, float):
            said[key] = Said(text, float(speed))  # type: ignore[arg-type]
    return said


async def _forget_pins(settings: Settings, tiers: list[Any], keys: set[str]) -> bool:
    """Drop the pin records of evicted pinned entries (their bytes leave the pin quota, and
    GET /v1/prompts stops listing them); False when the registry failed."""
    from cache.pins import PinRegistryError, registry_for
    from cache.tier import PurgeFilter

    registry = registry_for([t for t in tiers if t.name != "disk"], settings.cache_dir)
    try:
        await registry.forget(PurgeFilter(pinned=True, keys=frozenset(keys)))
    except PinRegistryError as exc:
        print(f"voxgate audit: pin records not released: {exc}", file=sys.stderr)
        return False
    finally:
        await registry.close()
    return True


async def _keys(tier: Any) -> list[str]:
    from cache.disk import DiskTier

    if isinstance(tier, DiskTier):
        return await asyncio.to_thread(lambda: list(tier.iter_keys_sync()))
    prefix = tier.entry_key("")
    found: list[str] = []

    async def scan() -> None:
        async for raw in tier.client.scan_iter(match=prefix.replace("*", r"\*") + "*"):
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            found.append(name[len(prefix) :])

    await tier.guarded("audit", scan, timeout_s=max(30.0, tier.timeout_s))
    return found


async def _tiers(settings: Settings) -> AsyncIterator[Any]:
    from cache.disk import DiskTier
    from cache.redis_tier import RedisTier

    if settings.disk_cache_mb > 0:
        yield await asyncio.to_thread(
            DiskTier, settings.cache_dir, max(1, settings.disk_cache_mb) * 1024 * 1024
        )
    redis_url = settings.redis_url.get_secret_value()
    if redis_url:
        yield RedisTier.from_url(
            redis_url,
            secret=settings.cache_secret.get_secret_value().encode(),
            prefix=settings.redis_prefix,
            timeout_s=settings.redis_timeout_ms / 1000,
        )


async def _audit(settings: Settings, args: argparse.Namespace) -> int:
    from cache.tier import TierError

    tiers = [tier async for tier in _tiers(settings)]
    checker = TakeChecker("signal")
    bad = failed = 0
    unpinned: set[str] = set()  # pinned entries evicted: their pin records go too
    try:
        said = await _said(settings, [t for t in tiers if t.name != "disk"])
        for tier in tiers:
            try:
                keys = await _keys(tier)
            except TierError as exc:
                print(f"voxgate audit: {tier.name} unreadable: {exc}", file=sys.stderr)
                failed += 1
                continue
            with tqdm(keys, desc=f"audit {tier.name}", unit="entry", file=sys.stderr) as bar:
                for key in bar:
                    try:
                        line = await _one(tier, key, checker, said.get(key), args)
                    except TierError as exc:
                        print(f"voxgate audit: {tier.name} failed: {exc}", file=sys.stderr)
                        failed += 1
                        break
                    if line is None:
                        continue  # gone since the listing
                    bad += line["verdict"] != "ok"
                    if line.get("evicted") and line.get("pinned"):
                        unpinned.add(key)
                    print(json.dumps(line), flush=True)
        if unpinned:
            failed += not await _forget_pins(settings, tiers, unpinned)
    finally:
        for tier in tiers:
            await tier.close()
    return EXIT_FAILED if bad or failed else 0


async def _one(
    tier: Any, key: str, checker: TakeChecker, said: Said | None, args: argparse.Namespace
) -> dict[str, Any] | None:
    line: dict[str, Any] = {"key": key, "tier": tier.name, "text": said is not None}
    try:
        entry = await tier.get(key)
    except CorruptEntry as exc:
        # Never decoded nor trusted: its bytes are not what was stored (or not a gateway's).
        line.update(voice="", model="", verdict="corrupt", reasons=[], error=str(exc))
        pinned = False
    else:
        if entry is None:
            return None
        verdict = await asyncio.to_thread(check_entry, checker, entry, said)
        pinned = entry.meta.pinned
        line.update(
            voice=entry.meta.voice,
            model=entry.meta.model,
            verdict="ok" if verdict.ok else "bad",
            reasons=list(verdict.reasons),
            pinned=pinned,
        )
        if verdict.ok:
            return line
    if args.evict and (not pinned or args.evict_pinned):
        line["evicted"] = await tier.delete(key)
    return line


def cmd_audit(args: argparse.Namespace) -> int:
    if args.evict_pinned and not args.evict:
        raise Refused("--evict-pinned confirms evicting pinned entries: give --evict with it")
    return run(args, _audit)


def add_command(sub: Any) -> None:
    """Register ``audit``."""
    parser = command(
        sub,
        "audit",
        cmd_audit,
        "Run the take checks over the stored audio (disk, and Redis when configured): a JSON "
        "line per entry; exit 1 when any is bad.",
    )
    parser.add_argument("--evict", action="store_true", help="Delete the bad entries (unpinned).")
    parser.add_argument(
        "--evict-pinned",
        action="store_true",
        help="With --evict: delete bad pinned (catalogue) entries too.",
    )
    add_setting_flags(parser, only=[*STORE_SETTINGS, "log_level", "log_format"])
