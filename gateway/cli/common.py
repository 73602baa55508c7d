"""What every command shares; exit statuses, the same in every command: README, "Command line"."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gateway.runtime.settings import CONFIG_ENV, ENV_PREFIX, GROUPS, Settings

T = TypeVar("T")
EXIT_FAILED = 1
EXIT_REFUSED = 2


class Refused(Exception):
    """A command refuses its arguments before any work: its message is printed, exit 2."""


def command(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], help: str, note: str = ""
) -> argparse.ArgumentParser:
    """Register command ``name`` (run by ``func``) on ``sub``; ``note`` ends the line printed
    when it stops on an error (what that error left undone)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help)
    parser.set_defaults(func=func, prog=parser.prog, note=note)
    return parser


def failure(exc: Exception) -> tuple[int, str] | None:
    """The exit status and message of an error a command stops on; None for a bug (raised on,
    with its traceback)."""
    from cache.pins import PinQuotaExceeded, PinRegistryError
    from gateway.errors import VoxgateError
    from gateway.speech.catalogue import quota_message

    if isinstance(exc, PinQuotaExceeded):
        return EXIT_REFUSED, quota_message(exc)
    if isinstance(exc, VoxgateError):
        return EXIT_REFUSED, exc.message
    # A bad catalogue, export, keys file, setting or model name: each a ValueError.
    if isinstance(exc, Refused | ValueError):
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, PinRegistryError):
        return EXIT_FAILED, str(exc)
    return None


def run(
    args: argparse.Namespace,
    work: Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, T]],
) -> T:
    """``work`` to its end, with the settings of ``args``, for a command printing its own results."""
    settings = load_settings(args)
    quiet_logging(settings)
    return asyncio.run(work(settings, args))


def report(args: argparse.Namespace, out: dict[str, Any], summary: str) -> int:
    """Print a catalogue run's ``out`` (JSON with ``--json``, else ``summary`` and a line per
    error); its exit status: 1 when a prompt failed."""
    if args.json:
        print(json.dumps(out))
    else:
        print(summary)
        for err in out["errors"]:
            where = " ".join(str(err[k]) for k in ("where", "file") if k in err)
            print(f"  {where}: {err['error']}")
    return EXIT_FAILED if out["failed"] else 0


# The settings a command that opens the stores (disk and Redis) reads.
STORE_SETTINGS = (
    "cache_dir",
    "disk_cache_mb",
    "redis_url",
    "cache_secret",
    "redis_prefix",
    "redis_timeout_ms",
)


def add_setting_flags(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """One ``--name`` flag per setting (or per setting in ``only``), in one help section per group.

    Every flag defaults to None, meaning "not given": the environment and the TOML file then
    decide (see :meth:`Settings.load`).
    """
    parser.add_argument("--config", help=f"TOML settings file (also ${ENV_PREFIX}CONFIG).")
    names = [n for n in Settings.names() if only is None or n in only]
    for group, title in GROUPS.items():
        members = [n for n in names if Settings.group_of(n) == group]
        if not members:
            continue
        section = parser.add_argument_group(title)
        for name in members:
            section.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                default=None,
                help=f"{Settings.model_fields[name].description} (env {ENV_PREFIX}{name.upper()})",
            )


def load_settings(args: argparse.Namespace, *, creates_config: bool = False) -> Settings:
    """The settings for a command: defaults < file < environment < its flags.

    ``creates_config``: the command writes the config file (``voxgate tune``), so a file that
    does not exist yet is read as an empty one rather than refused.
    """
    overrides = {name: getattr(args, name, None) for name in Settings.names()}
    path = args.config or os.environ.get(CONFIG_ENV)
    if creates_config and path and not Path(path).exists():
        env = {k: v for k, v in os.environ.items() if k != CONFIG_ENV}
        return Settings.load(env=env, overrides=overrides)
    return Settings.load(config_file=args.config, overrides=overrides)


def setup_logging(level: str) -> None:
    """Plain stderr logging for a one-shot command."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # piper-tts logs each request's text and phonemes at DEBUG: request text must never reach the
    # logs, whatever level voxgate runs at.
    logging.getLogger("piper").setLevel(max(logging.INFO, logging.getLogger().level))


def quiet_logging(settings: Settings) -> None:
    """Logging for commands that print their own results (progress bars, summaries)."""
    from gateway.runtime.logs import configure_logging

    # Commands print their own results; library INFO lines would interleave with the progress bar.
    level = "warning" if settings.log_level == "info" else settings.log_level
    configure_logging(level, settings.log_format)
