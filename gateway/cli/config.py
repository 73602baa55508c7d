"""``voxgate config show``: the effective settings, secrets masked."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gateway.cli.common import add_setting_flags, command, load_settings


def cmd_config_show(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    print(json.dumps(settings.shown(), indent=2, default=str))
    return 0


def add_command(sub: Any) -> None:
    """Register ``config show``."""
    config = sub.add_parser("config", help="Settings.")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = command(
        config_sub, "show", cmd_config_show, "Print the effective settings (secrets masked)."
    )
    add_setting_flags(show)
