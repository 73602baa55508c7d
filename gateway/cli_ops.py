"""Operator commands: ``voxgate warm FILE`` and ``voxgate cache purge``."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.settings import Settings

SettingFlags = Callable[..., None]
LoadSettings = Callable[[argparse.Namespace], Settings]

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


def _cli_logging(settings: Settings) -> None:
    from gateway.logs import configure_logging

    # Commands print their own results; library INFO lines would interleave with the progress bar.
    level = "warning" if settings.log_level == "info" else settings.log_level
    configure_logging(level, settings.log_format)


# ---- warm ---------------------------------------------------------------------------------


async def _warm(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    from gateway.catalogue import read_catalogue, render, to_requests
    from gateway.components import open_speech
    from metrics import Metrics

    prompts = read_catalogue(Path(args.file))
    defaults: dict[str, Any] = {}
    for name, value in (
        ("model", args.model),
        ("voice", args.voice),
        ("response_format", args.format),
        ("sample_rate", args.rate),
        ("speed", args.speed),
    ):
        if value is not None:
            defaults[name] = value
    if "response_format" not in defaults:
        defaults["response_format"] = settings.default_format
    metrics = Metrics()
    async with open_speech(settings, metrics, wait_ready=True) as service:
        requests = to_requests(prompts, defaults, settings, service)
        with tqdm(
            total=len(requests), desc="warming", unit="prompt", file=sys.stderr, mininterval=0.2
        ) as bar:
            counts = {"miss": 0, "hit": 0, "coalesced": 0, "error": 0}

            def done(result: Any) -> None:
                counts[result.cache] = counts.get(result.cache, 0) + 1
                bar.set_postfix(
                    synthesized=counts["miss"],
                    cached=counts["hit"] + counts["coalesced"],
                    failed=counts["error"],
                    refresh=False,
                )
                bar.update(1)

            summary = await render(
                service, requests, metrics, concurrency=settings.catalogue_concurrency, on_done=done
            )
        await service.store.drain()
    out = summary.as_json()
    out["file"] = str(args.file)
    errors = [r for r in summary.results if r.error is not None]
    out["errors"] = [{"where": prompts[r.index].where, "error": r.error} for r in errors[:20]]
    return out


def cmd_warm(args: argparse.Namespace, load: LoadSettings) -> int:
    from gateway.catalogue import CatalogueError
    from gateway.errors import VoxgateError

    settings = load(args)
    _cli_logging(settings)
    try:
        out = asyncio.run(_warm(settings, args))
    except CatalogueError as exc:
        print(f"voxgate warm: {exc}", file=sys.stderr)
        return 2
    except VoxgateError as exc:
        print(f"voxgate warm: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{out['prompts']} prompts in {out['seconds']:.1f}s: {out['synthesized']} synthesized, "
            f"{out['cached']} already cached, {out['coalesced']} coalesced, {out['failed']} failed; "
            f"{out['bytes']} bytes pinned"
        )
        for err in out["errors"]:
            print(f"  {err['where']}: {err['error']}")
    return 1 if out["failed"] else 0


# ---- cache purge --------------------------------------------------------------------------


async def _purge(settings: Settings, args: argparse.Namespace) -> dict[str, int]:
    from cache.tier import PurgeFilter
    from gateway.components import open_store
    from metrics import Metrics

    match = PurgeFilter(
        voice=args.voice,
        model=args.model,
        older_than=time.time() - args.older_than if args.older_than is not None else None,
        pinned=False if args.unpinned else True if args.pinned else None,
    )
    # Only the shared tiers: this process's memory tier is empty, and a running gateway's memory
    # tier is its own (it ages out, and a restart empties it).
    async with open_store(settings.replace(memory_cache_mb=0), Metrics()) as store:
        return await store.purge(match)


def cmd_cache_purge(args: argparse.Namespace, load: LoadSettings) -> int:
    settings = load(args)
    _cli_logging(settings)
    if args.unpinned and args.pinned:
        print("voxgate cache purge: --pinned and --unpinned exclude each other", file=sys.stderr)
        return 2
    chosen = (args.voice, args.model, args.older_than)
    if all(c is None for c in chosen) and not (args.unpinned or args.pinned or args.all):
        print(
            "voxgate cache purge: name what to purge (--voice, --model, --older-than, "
            "--unpinned, --pinned) or pass --all",
            file=sys.stderr,
        )
        return 2
    removed = asyncio.run(_purge(settings, args))
    if args.json:
        print(json.dumps({"removed": removed}))
    else:
        for tier, n in removed.items():
            print(f"{tier:<8} {'failed (see log)' if n < 0 else f'{n} entries removed'}")
    return 1 if any(n < 0 for n in removed.values()) else 0


# ---- registration -------------------------------------------------------------------------


def add_operations_commands(
    sub: Any, cache_sub: Any, setting_flags: SettingFlags, load: LoadSettings
) -> None:
    """Add ``warm`` and ``cache purge`` to the ``voxgate`` parser."""
    warm = sub.add_parser(
        "warm",
        help="Render and pin a prompt catalogue (txt: one prompt a line; CSV or YAML with "
        "text, voice, model, format, rate, speed per prompt).",
    )
    warm.add_argument("file", help="Catalogue file: .txt, .csv, .yaml/.yml.")
    warm.add_argument("--model", help="Model for prompts that name none.")
    warm.add_argument("--voice", help="Voice for prompts that name none.")
    warm.add_argument("--format", help="Format for prompts that name none (default_format).")
    warm.add_argument("--rate", type=int, help="Sample rate (Hz) for prompts that name none.")
    warm.add_argument("--speed", type=float, help="Speed for prompts that name none.")
    warm.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    setting_flags(warm)
    warm.set_defaults(func=lambda a: cmd_warm(a, load))

    purge = cache_sub.add_parser(
        "purge", help="Remove entries from the disk (and shared) tiers by voice, model, age, pin."
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
    setting_flags(purge)
    purge.set_defaults(func=lambda a: cmd_cache_purge(a, load))
