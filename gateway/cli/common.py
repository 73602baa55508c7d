"""What every command shares: one ``--flag`` per setting, loading settings, and log set-up."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.runtime.settings import CONFIG_ENV, ENV_PREFIX, GROUPS, Settings


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
