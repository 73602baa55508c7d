"""``voxgate cache stats`` and ``voxgate cache purge``: inspect and prune the stored audio."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from typing import Any

from gateway.cli.common import (
    EXIT_FAILED,
    STORE_SETTINGS,
    Refused,
    add_setting_flags,
    command,
    load_settings,
    run,
)
from gateway.runtime.settings import Settings

MIB = 1024 * 1024
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w``."""
    m = _DURATION.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with s, m, h, d or w (e.g. 7d)"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


async def _cache_stats(settings: Settings) -> list[dict[str, Any]]:
    from cache.disk import DiskTier
    from cache.redis_tier import RedisTier
    from cache.tier import TierError

    tier = DiskTier(settings.cache_dir, max(1, settings.disk_cache_mb) * 1024 * 1024)
    try:
        s = await tier.stats()
    finally:
        await tier.close()
    rows: list[dict[str, Any]] = [
        {
            "tier": s.name,
            "directory": str(settings.cache_dir),
            "entries": s.entries,
            "bytes": s.bytes,
            "max_bytes": s.max_bytes,
            "pinned": s.pinned,
        }
    ]
    redis_url = settings.redis_url.get_secret_value()
    if not redis_url:
        return [*rows, await _pins_row(settings, [])]
    # The memory tier lives inside each server process: its figures are on /metrics.
    redis = RedisTier.from_url(
        redis_url,
        secret=settings.cache_secret.get_secret_value().encode(),
        prefix=settings.redis_prefix,
        timeout_s=settings.redis_timeout_ms / 1000,
    )
    row: dict[str, Any] = {"tier": "redis", "url": _safe_url(redis_url)}
    try:
        try:
            r = await redis.stats()
            row.update(keys=r.entries, used_memory_bytes=r.bytes)
        except TierError as exc:
            row["error"] = str(exc)
        return [*rows, row, await _pins_row(settings, [redis])]
    finally:
        await redis.close()


async def _pins_row(settings: Settings, tiers: list[Any]) -> dict[str, Any]:
    from cache.pins import PinRegistryError, registry_for

    registry = registry_for(tiers, settings.cache_dir)
    row: dict[str, Any] = {
        "tier": "pins",
        "registry": registry.where,
        "quota_bytes": settings.pin_quota_mb * MIB,
        "quota_per_key_bytes": settings.pin_quota_mb_per_key * MIB,
    }
    try:
        usage = await registry.usage()
        row.update(pinned_bytes=usage.total, owners=dict(sorted(usage.owners.items())))
    except PinRegistryError as exc:
        row["error"] = str(exc)
    finally:
        await registry.close()
    return row


def _safe_url(url: str) -> str:
    """``url`` without its password (a stats line may end up in a ticket)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def cmd_cache_stats(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    stats = asyncio.run(_cache_stats(settings))
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        for s in stats:
            if s["tier"] == "pins":
                print(f"pins     the pin registry ({s['registry']})")
                if "error" in s:
                    print(f"  unreadable: {s['error']}")
                    continue
                print(
                    f"  pinned  {s['pinned_bytes']:>10}  bytes of {s['quota_bytes']} "
                    f"(pin_quota_mb; per key: {s['quota_per_key_bytes']})"
                )
                for owner, n in s["owners"].items():
                    print(f"  {owner:<24} {n:>10}  bytes")
                continue
            if s["tier"] == "redis":
                print(f"redis    {s['url']}")
                if "error" in s:
                    print(f"  unreachable: {s['error']}")
                else:
                    print(
                        f"  keys    {s['keys']:>10}  (the whole database: Redis may be shared)\n"
                        f"  memory  {s['used_memory_bytes']:>10}  bytes used"
                    )
                continue
            print(
                f"{s['tier']:<8} {s['directory']}\n  entries {s['entries']:>10}  "
                f"(pinned {s['pinned']})\n  bytes   {s['bytes']:>10}  "
                f"of {s['max_bytes']} max"
            )
    return 0 if all("error" not in s for s in stats) else EXIT_FAILED


async def _purge(settings: Settings, args: argparse.Namespace) -> tuple[dict[str, int], int]:
    from cache.tier import PurgeFilter
    from gateway.runtime.components import open_pins, open_store
    from metrics import Metrics

    match = PurgeFilter(
        voice=args.voice,
        model=args.model,
        older_than=time.time() - args.older_than if args.older_than is not None else None,
        pinned=False if args.unpinned else True if args.pinned else None,
    )
    # Only the shared tiers: this process's memory tier is empty, and a running gateway's memory
    # tier is its own (it ages out, and a restart empties it).
    async with (
        open_store(settings.replace(memory_cache_mb=0), Metrics()) as store,
        open_pins(settings, store) as registry,
    ):
        removed = await store.purge(match)
        # Purged pins give their bytes back to their owners' quota.
        released = await registry.forget(match) if match.pinned is not False else 0
        return removed, released


def cmd_cache_purge(args: argparse.Namespace) -> int:
    if args.unpinned and args.pinned:
        raise Refused("--pinned and --unpinned exclude each other")
    chosen = (args.voice, args.model, args.older_than)
    if all(c is None for c in chosen) and not (args.unpinned or args.pinned or args.all):
        raise Refused(
            "name what to purge (--voice, --model, --older-than, --unpinned, --pinned) or pass "
            "--all"
        )
    removed, released = run(args, _purge)
    if args.json:
        out: dict[str, Any] = {"removed": removed}
        if released:
            out["pins_released"] = released
        print(json.dumps(out))
    else:
        for tier, n in removed.items():
            print(f"{tier:<8} {'failed (see log)' if n < 0 else f'{n} entries removed'}")
        if released:
            print(f"pins     {released} records released from the pin quota")
    return EXIT_FAILED if any(n < 0 for n in removed.values()) else 0


def add_command(sub: Any) -> None:
    """Register ``cache stats`` and ``cache purge``."""
    cache = sub.add_parser("cache", help="Inspect and prune the stored audio.")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    stats = command(
        cache_sub,
        "stats",
        cmd_cache_stats,
        "Entries and bytes in the disk tier, and the Redis tier's when configured.",
    )
    stats.add_argument("--json", action="store_true", help="Print JSON.")
    add_setting_flags(stats, only=[*STORE_SETTINGS, "pin_quota_mb", "pin_quota_mb_per_key"])

    purge = command(
        cache_sub,
        "purge",
        cmd_cache_purge,
        "Remove entries from the disk (and shared) tiers by voice, model, age, pin.",
    )
    purge.add_argument("--voice", help="Only entries of this voice.")
    purge.add_argument("--model", help="Only entries of this model.")
    purge.add_argument(
        "--older-than", type=parse_duration, help="Only entries stored longer ago (7d, 12h, 30m)."
    )
    purge.add_argument("--unpinned", action="store_true", help="Only unpinned entries.")
    purge.add_argument("--pinned", action="store_true", help="Only pinned (catalogue) entries.")
    purge.add_argument("--all", action="store_true", help="Everything (no criterion needed).")
    purge.add_argument("--json", action="store_true", help="Print JSON.")
    add_setting_flags(purge)
