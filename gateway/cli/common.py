"""What every command shares: one ``--flag`` per setting, loading settings, and log set-up."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import fields

from gateway.runtime.settings import Settings


def add_setting_flags(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
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


def load_settings(args: argparse.Namespace) -> Settings:
    """The settings for a command: defaults < file < environment < its flags."""
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Settings)}
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
