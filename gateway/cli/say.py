"""``voxgate say TEXT -o FILE``: one synthesis through the same store as the server.

``--ssml`` and ``--explain``: docs/ssml.md."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from gateway.api.frontend import NORMALIZE_MODES
from gateway.cli.common import Refused, add_setting_flags, command, load_settings, setup_logging
from gateway.runtime.settings import Settings


async def _say(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from gateway.api.parsing import parse_speech_object
    from gateway.runtime.components import open_speech
    from metrics import Metrics

    metrics = Metrics()
    async with open_speech(settings, metrics, wait_ready=not args.explain) as service:
        body: dict[str, Any] = {
            "model": args.model or settings.default_model,
            "input": args.text,
            "voice": args.voice or settings.default_voice,
            "response_format": args.format,
            "speed": args.speed,
        }
        if args.sample_rate:
            body["sample_rate"] = args.sample_rate
        if args.ssml:
            body["input_type"] = "ssml"
        if args.normalize:
            body["normalize"] = args.normalize
        call = parse_speech_object(body, settings, service.vocabulary)
        req = call.req
        if args.explain:
            return await service.explain(req, call.front_end)
        result = await service.speak(req)
        await service.store.drain()
    await asyncio.to_thread(Path(args.output).write_bytes, result.entry.audio)
    return {
        "output": args.output,
        "key": result.key,
        "cache": result.cache,
        "bytes": len(result.entry.audio),
        "format": result.entry.meta.format,
        "sample_rate": result.entry.meta.sample_rate,
        "duration_s": round(result.entry.meta.duration_s, 3),
    }


def cmd_say(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    if settings.synth_workers == "auto":
        # One text: starting a pool of worker processes (a spawn and an engine load each) costs
        # more than the synthesis; the engine runs in this process, the same one as a pool's.
        settings = settings.replace(synth_workers=0)
    setup_logging("warning" if settings.log_level == "info" else settings.log_level)
    if args.output is None and not args.explain:
        raise Refused("-o/--output is required (or --explain)")
    args.format = args.format or Path(args.output or "").suffix.lstrip(".") or "wav"
    info = asyncio.run(_say(settings, args))
    print(json.dumps(info, indent=2 if args.explain else None, ensure_ascii=False))
    return 0


def add_command(sub: Any) -> None:
    """Register ``say``."""
    say = command(sub, "say", cmd_say, "Synthesize TEXT to a file through the store.")
    say.add_argument("text")
    say.add_argument("-o", "--output", help="Output file (required unless --explain).")
    say.add_argument(
        "--ssml", action="store_true", help="TEXT is SSML (docs/ssml.md), with or without <speak>."
    )
    say.add_argument(
        "--explain",
        action="store_true",
        help="Print the expansion, its sentences and the content address; synthesize nothing.",
    )
    say.add_argument(
        "--normalize",
        choices=NORMALIZE_MODES,
        help="Text front end (default: the setting, auto: the model's own).",
    )
    say.add_argument("--model", help="Model or alias (default: the default model).")
    say.add_argument("--voice", help="Voice or alias (default: the default voice).")
    say.add_argument("--format", help="Output format (default: from -o's suffix, else wav).")
    say.add_argument("--speed", type=float, default=1.0, help="0.25-4.0 (default 1.0).")
    say.add_argument("--sample-rate", type=int, help="Output rate in Hz (8000-48000).")
    add_setting_flags(say, only=["cache_dir", "piper_voices", "memory_cache_mb", "disk_cache_mb"])
