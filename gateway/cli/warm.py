"""``voxgate warm FILE``: render and pin a prompt catalogue, with a progress bar."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gateway.cli.common import add_setting_flags, command, report, run
from gateway.runtime.settings import Settings


async def _warm(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from cache.pins import ANONYMOUS, PinQuota
    from gateway.api.catalogue import check_ids, read_catalogue, to_requests
    from gateway.runtime.components import open_pins, open_speech
    from gateway.speech.catalogue import pin, render
    from metrics import Metrics

    prompts = read_catalogue(Path(args.file))
    check_ids(prompts)  # ids are optional here; a bad one is refused before any work
    given = {
        "model": args.model,
        "voice": args.voice,
        "response_format": args.format,
        "sample_rate": args.rate,
        "speed": args.speed,
    }
    defaults = {name: value for name, value in given.items() if value is not None}
    defaults.setdefault("response_format", settings.default_format)
    metrics = Metrics()
    async with (
        open_speech(settings, metrics, wait_ready=True) as service,
        open_pins(settings, service.store) as registry,
    ):
        requests = to_requests(prompts, defaults, settings, service.vocabulary)
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
        # The operator's pins have no key: bounded by the total quota, like keyless requests.
        quota = PinQuota(settings.pin_quota_mb * 1024 * 1024)
        ids = [p.id for p in prompts]
        await pin(service, registry, summary, requests, ids, owner=ANONYMOUS, quota=quota)
        await service.store.drain()
    out = summary.as_json()
    out["file"] = str(args.file)
    errors = [r for r in summary.results if r.error is not None]
    out["errors"] = [{"where": prompts[r.index].where, "error": r.error} for r in errors[:20]]
    return out


def cmd_warm(args: argparse.Namespace) -> int:
    out = run(args, _warm)
    return report(
        args,
        out,
        f"{out['prompts']} prompts in {out['seconds']:.1f}s: {out['synthesized']} synthesized, "
        f"{out['cached']} already cached, {out['coalesced']} coalesced, {out['failed']} failed; "
        f"{out['bytes']} bytes pinned",
    )


def add_command(sub: Any) -> None:
    """Register ``warm``."""
    warm = command(
        sub,
        "warm",
        cmd_warm,
        "Render and pin a prompt catalogue (txt: one prompt a line; CSV or YAML with "
        "text, voice, model, format, rate, speed per prompt).",
    )
    warm.add_argument("file", help="Catalogue file: .txt, .csv, .yaml/.yml.")
    warm.add_argument("--model", help="Model for prompts that name none.")
    warm.add_argument("--voice", help="Voice for prompts that name none.")
    warm.add_argument("--format", help="Format for prompts that name none (default_format).")
    warm.add_argument("--rate", type=int, help="Sample rate (Hz) for prompts that name none.")
    warm.add_argument("--speed", type=float, help="Speed for prompts that name none.")
    warm.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    add_setting_flags(warm)
