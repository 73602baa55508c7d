"""The ``voxgate`` command: serve, say, cache stats, config show."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.settings import Settings, SettingsError

log = logging.getLogger("voxgate")


def _setting_flags(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """One ``--name`` flag per setting (or per setting in ``only``), help from the field."""
    parser.add_argument("--config", help="TOML settings file (also $VOXGATE_CONFIG).")
    for f in fields(Settings):
        if only is not None and f.name not in only:
            continue
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            default=None,
            help=f"{f.metadata['help']} (env VOXGATE_{f.name.upper()})",
        )


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Settings)}
    return Settings.load(config_file=args.config, overrides=overrides)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # piper-tts logs each request's text and phonemes at DEBUG: request text must never reach the
    # logs, whatever level voxgate runs at.
    logging.getLogger("piper").setLevel(max(logging.INFO, logging.getLogger().level))


# ---- serve --------------------------------------------------------------------------------


async def _serve(settings: Settings, worker_of: int | None = None) -> None:
    from gateway.app import create_app, wait_ready

    app = create_app(settings)
    # On SIGTERM, runner.cleanup() stops listening, lets in-flight requests finish for up to
    # shutdown_timeout_s, then runs the cleanup contexts (schedulers, engines, tiers) in reverse.
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=settings.shutdown_timeout_s
    )
    await runner.setup()
    # A worker of `serve --workers N` shares the port with its siblings (SO_REUSEPORT).
    site = web.TCPSite(runner, settings.host, settings.port, reuse_port=worker_of is not None)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    orphan_watch = None
    if worker_of is not None:
        from gateway.workers import watch_parent

        orphan_watch = asyncio.ensure_future(watch_parent(worker_of, stop))
    addresses = []
    server = getattr(site, "_server", None)
    for sock in getattr(server, "sockets", None) or []:
        host, port = sock.getsockname()[:2]
        addresses.append(f"http://{host}:{port}")
    from gateway.eventloop import describe

    log.info(
        "listening on %s (event loop: %s); loading models",
        ", ".join(addresses) or site.name,
        describe(loop),
    )
    ready = asyncio.ensure_future(wait_ready(app))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():
        log.info(
            "voxgate ready on %s (cache: %s)", ", ".join(addresses) or site.name, settings.cache_dir
        )
        await stopped
    else:
        ready.cancel()
    if orphan_watch is not None:
        orphan_watch.cancel()
    log.info("shutting down: draining in-flight requests (up to %ss)", settings.shutdown_timeout_s)
    await runner.cleanup()
    log.info("stopped")


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.logs import configure_logging

    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    if settings.workers > 1 and args.worker_of is None:
        from gateway.workers import run_workers

        return run_workers(settings, args.argv)
    from gateway import eventloop

    try:
        eventloop.resolve(settings.event_loop)
    except eventloop.EventLoopUnavailable as exc:
        raise SettingsError(f"setting 'event_loop': {exc}") from exc
    eventloop.run(_serve(settings, args.worker_of), settings.event_loop)
    return 0


# ---- say ----------------------------------------------------------------------------------


async def _say(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from gateway.components import open_speech
    from gateway.parsing import parse_openai_speech
    from metrics import Metrics

    metrics = Metrics()
    async with open_speech(settings, metrics, wait_ready=True) as service:
        body: dict[str, Any] = {
            "model": args.model or settings.default_model,
            "input": args.text,
            "voice": args.voice or settings.default_voice,
            "response_format": args.format,
            "speed": args.speed,
        }
        if args.sample_rate:
            body["sample_rate"] = args.sample_rate
        req = parse_openai_speech(body, settings, service)
        result = await service.speak(req)
        await service.store.drain()
    await asyncio.to_thread(Path(args.output).write_bytes, result.entry.audio)
    return {
        "output": args.output,
        "key": result.key,
        "cache": result.cache,
        "bytes": result.entry.size,
        "format": result.entry.meta.format,
        "sample_rate": result.entry.meta.sample_rate,
        "duration_s": round(result.entry.meta.duration_s, 3),
    }


def cmd_say(args: argparse.Namespace) -> int:
    from gateway.errors import VoxgateError

    settings = _settings(args)
    _setup_logging("warning" if settings.log_level == "info" else settings.log_level)
    fmt = args.format or Path(args.output).suffix.lstrip(".") or "wav"
    args.format = fmt
    try:
        info = asyncio.run(_say(settings, args))
    except VoxgateError as exc:
        print(f"voxgate say: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0


# ---- cache --------------------------------------------------------------------------------


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
    if settings.redis_url:
        # The memory tier lives inside each server process: its figures are on /metrics.
        redis = RedisTier.from_url(
            settings.redis_url,
            prefix=settings.redis_prefix,
            timeout_s=settings.redis_timeout_ms / 1000,
        )
        row: dict[str, Any] = {"tier": "redis", "url": _safe_url(settings.redis_url)}
        try:
            r = await redis.stats()
            row.update(keys=r.entries, used_memory_bytes=r.bytes)
        except TierError as exc:
            row["error"] = str(exc)
        finally:
            await redis.close()
        rows.append(row)
    return rows


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
    settings = _settings(args)
    stats = asyncio.run(_cache_stats(settings))
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        for s in stats:
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
    return 0 if all("error" not in s for s in stats) else 1


def cmd_config_show(args: argparse.Namespace) -> int:
    settings = _settings(args)
    print(json.dumps(settings.shown(), indent=2, default=str))
    return 0


# ---- entry point --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``voxgate`` argument parser."""
    parser = argparse.ArgumentParser(prog="voxgate", description="Cached text-to-speech gateway.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="Run the HTTP gateway.")
    _setting_flags(serve)
    serve.add_argument("--worker-of", type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    say = sub.add_parser("say", help="Synthesize TEXT to a file through the store.")
    say.add_argument("text")
    say.add_argument("-o", "--output", required=True, help="Output file.")
    say.add_argument("--model", help="Model or alias (default: the default model).")
    say.add_argument("--voice", help="Voice or alias (default: the default voice).")
    say.add_argument("--format", help="Output format (default: from -o's suffix, else wav).")
    say.add_argument("--speed", type=float, default=1.0, help="0.25-4.0 (default 1.0).")
    say.add_argument("--sample-rate", type=int, help="Output rate in Hz (8000-48000).")
    _setting_flags(say, only=["cache_dir", "piper_voices", "memory_cache_mb", "disk_cache_mb"])
    say.set_defaults(func=cmd_say)

    cache = sub.add_parser("cache", help="Inspect the disk tier.")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    stats = cache_sub.add_parser(
        "stats", help="Entries and bytes in the disk tier, and the Redis tier's when configured."
    )
    stats.add_argument("--json", action="store_true", help="Print JSON.")
    _setting_flags(
        stats,
        only=["cache_dir", "disk_cache_mb", "redis_url", "redis_prefix", "redis_timeout_ms"],
    )
    stats.set_defaults(func=cmd_cache_stats)

    config = sub.add_parser("config", help="Settings.")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="Print the effective settings (secrets masked).")
    _setting_flags(show)
    show.set_defaults(func=cmd_config_show)

    # --- operations (issue 6) ---
    from gateway.cli_ops import add_operations_commands

    add_operations_commands(sub, cache_sub, _setting_flags, _settings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``voxgate`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # for `serve --workers N`
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print(f"voxgate: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
