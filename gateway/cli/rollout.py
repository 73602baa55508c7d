"""``voxgate rollout MODEL --revision N``: re-render a model's pinned prompts at a new address
revision, with a progress bar, and switch the model when all are rendered
(:mod:`gateway.speech.rollout`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from gateway.cli.common import EXIT_FAILED, add_setting_flags, command, run
from gateway.runtime.settings import Settings


async def run_rollout(
    settings: Settings, args: argparse.Namespace, engines: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The rollout ``args`` ask for on ``settings``' models (or ``engines``); its JSON report."""
    from cache.pins import PinQuota
    from gateway.api.catalogue import Prompt, to_requests
    from gateway.runtime.components import open_pins, open_speech
    from gateway.speech.catalogue import PromptResult
    from gateway.speech.request import SpeechRequest
    from gateway.speech.rollout import rollout
    from metrics import Metrics

    metrics = Metrics()
    async with (
        open_speech(settings, metrics, engines, wait_ready=True) as service,
        open_pins(settings, service.store) as registry,
    ):

        def parse(body: dict[str, Any]) -> SpeechRequest:
            (req,) = to_requests(
                [Prompt(body, "a pinned prompt")], {}, settings, service.vocabulary
            )
            return req

        with tqdm(
            desc=f"rollout {args.model} -> {args.revision}",
            unit="prompt",
            file=sys.stderr,
            mininterval=0.2,
            disable=args.quiet,
        ) as bar:
            counts = {"rendered": 0, "already": 0, "failed": 0}

            def done(result: PromptResult) -> None:
                state = {"miss": "rendered", "coalesced": "rendered", "hit": "already"}
                counts[state.get(result.cache, "failed")] += 1
                bar.set_postfix(refresh=False, **counts)
                bar.update(1)

            report = await rollout(
                service,
                registry,
                args.model,
                args.revision,
                parse=parse,
                # The operator's pins, as `voxgate warm` makes them: within the total quota.
                quota=PinQuota(settings.pin_quota_mb * 1024 * 1024),
                concurrency=args.concurrency or settings.catalogue_concurrency,
                metrics=metrics,
                allow_unrenderable=args.allow_unrenderable,
                on_total=lambda n: bar.reset(total=n),
                on_done=done,
            )
    return report.as_json()


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def cmd_rollout(args: argparse.Namespace) -> int:
    out = run(args, run_rollout)
    if args.json:
        print(json.dumps(out))
    else:
        for p in out["changes"]:
            what = p["error"] if p["state"] == "error" else p["state"]
            change = "-" if p["change_s"] is None else f"{p['change_s']:+.2f}s"
            print(
                f"  {p['id'] or p['text']!s:<40.40} {_seconds(p['old_duration_s'])} -> "
                f"{_seconds(p['new_duration_s'])} ({change}) {what}"
            )
        print(
            f"{out['prompts']} prompts of {out['model']}: {out['rendered']} rendered, "
            f"{out['already']} already rendered, {out['failed']} failed; "
            + (
                f"switched to revision {out['revision']}"
                if out["switched"]
                else f"not switched: {out['reason']}"
            )
        )
    return 0 if out["switched"] else EXIT_FAILED


def add_command(sub: Any) -> None:
    """Register ``rollout``."""
    cmd = command(
        sub,
        "rollout",
        cmd_rollout,
        "Re-render every pinned prompt of MODEL at a new address revision beside the old "
        "audio, report each prompt's duration change, and switch MODEL to it once all are "
        "rendered (resumable: run it again after an interruption).",
        note="the model was not switched",
    )
    cmd.add_argument("model", help="The model (a local one or an upstream's name).")
    cmd.add_argument("--revision", required=True, help="The new address revision (any label).")
    cmd.add_argument(
        "--concurrency", type=int, help="Prompts rendered at once (catalogue_concurrency)."
    )
    cmd.add_argument(
        "--allow-unrenderable",
        action="store_true",
        help="Switch even though prompts pinned as SSML or longer than 1,000 characters (whose "
        "labels cannot say them again) are not rendered: they are synthesized on first request.",
    )
    cmd.add_argument("--json", action="store_true", help="Print the report as JSON.")
    cmd.add_argument("--quiet", action="store_true", help="No progress bar.")
    add_setting_flags(cmd)
