"""``voxgate export CATALOGUE DIR``: a prompt catalogue as sound files for a PBX, with a
progress bar and a ``--json`` summary (the work: :mod:`gateway.speech.export`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# (At import, not on the event loop: a first import reads package metadata from disk.)
from tqdm import tqdm

from gateway.cli.common import add_setting_flags, command, report, run
from gateway.runtime.settings import Settings
from synth.engine import Engine


async def run_export(
    settings: Settings, args: argparse.Namespace, engines: Mapping[str, Engine] | None = None
) -> dict[str, Any]:
    """Export ``args.catalogue`` into ``args.dir``; the summary (``engines`` replaces the
    configured engines, as in :func:`gateway.http.app.create_app`)."""
    from gateway.api.catalogue import check_ids, read_catalogue, to_requests
    from gateway.runtime.components import open_speech
    from gateway.speech.export import ExportItem, export, plan_formats
    from metrics import Metrics

    # Everything that can be refused is refused before a model loads or a file is written.
    formats = plan_formats([f.strip() for f in args.format.split(",") if f.strip()], args.layout)
    prompts = await asyncio.to_thread(read_catalogue, Path(args.catalogue))
    check_ids(prompts, required=True)
    given = {"model": args.model, "voice": args.voice, "speed": args.speed}
    defaults = {"response_format": "wav", **{k: v for k, v in given.items() if v is not None}}
    metrics = Metrics()
    async with open_speech(settings, metrics, engines, wait_ready=True) as service:
        requests = to_requests(prompts, defaults, settings, service.vocabulary)
        items = [
            ExportItem(str(p.id), req, p.where) for p, req in zip(prompts, requests, strict=True)
        ]
        with tqdm(
            total=len(items) * len(formats),
            desc="exporting",
            unit="file",
            file=sys.stderr,
            mininterval=0.2,
            disable=args.no_progress,
        ) as bar:
            summary = await export(
                service,
                items,
                formats,
                Path(args.dir),
                args.layout,
                concurrency=settings.catalogue_concurrency,
                on_file=lambda _: bar.update(1),
            )
        await service.store.drain()
    out = summary.as_json()
    out.update(
        catalogue=str(args.catalogue),
        dir=str(args.dir),
        layout=args.layout,
        formats=[f.name for f in formats],
    )
    return out


def cmd_export(args: argparse.Namespace) -> int:
    out = run(args, run_export)
    return report(
        args,
        out,
        f"{out['prompts']} prompts, {out['files']} files in {out['seconds']:.1f}s: "
        f"{out['written']} written, {out['unchanged']} unchanged, {out['failed']} failed "
        f"({out['synthesized']} synthesized) -> {out['dir']} ({out['layout']} layout)",
    )


def add_command(sub: Any) -> None:
    """Register ``export``."""
    from gateway.speech.export import LAYOUTS

    export = command(
        sub,
        "export",
        cmd_export,
        "Write a prompt catalogue (with an id per prompt) as sound files for a PBX.",
    )
    export.add_argument("catalogue", help="Catalogue file (.csv or .yaml with an id per prompt).")
    export.add_argument("dir", help="Directory to write the files and manifest.json into.")
    export.add_argument(
        "--format",
        default="wav",
        help="Comma-separated extensions, e.g. ulaw,wav,sln16 (see docs/telephony.md).",
    )
    export.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="asterisk",
        help="asterisk: DIR/<id>.<ext>; freeswitch: DIR/<rate>/<id>.wav; flat: DIR/<id>.<ext> "
        "for any format.",
    )
    export.add_argument("--model", help="Model for prompts that name none.")
    export.add_argument("--voice", help="Voice for prompts that name none.")
    export.add_argument("--speed", type=float, help="Speed for prompts that name none.")
    export.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    export.add_argument("--no-progress", action="store_true", help="No progress bar.")
    add_setting_flags(export)
