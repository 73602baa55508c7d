"""The ``voxgate`` command: one module per command group beside this one."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gateway.cli.common import EXIT_REFUSED, failure
from gateway.runtime.settings import SettingsError

# Each command and the module (gateway.cli.<module>) that registers it, in the order
# `voxgate --help` lists them. A run of one command imports only that command's module: the
# others cost a CLI call (and every start of `serve`) their imports for nothing.
COMMANDS: dict[str, str] = {
    "serve": "serve",
    "say": "say",
    "warm": "warm",
    "rollout": "rollout",
    "export": "export",
    "sign-url": "signurl",
    "keys": "keys",
    "cache": "cache",
    "audit": "audit",
    "config": "config",
    "tune": "tune",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``voxgate`` argument parser; with ``only`` (a command), the other commands are
    registered by name alone, which is all that parsing ``only``'s arguments reads of them
    (the choices in a usage line)."""
    parser = argparse.ArgumentParser(prog="voxgate", description="Cached text-to-speech gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"gateway.cli.{module}").add_command(sub)
        else:
            sub.add_parser(name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``voxgate`` command."""
    given = list(argv) if argv is not None else sys.argv[1:]
    # A first word that names a command is that command's, whatever follows it (the top-level
    # parser has no options but -h); anything else (--help, a typo) gets the whole parser.
    parser = build_parser(given[0] if given and given[0] in COMMANDS else None)
    args = parser.parse_args(given)
    args.argv = given  # for `serve --workers N`
    try:
        return int(args.func(args))
    except SettingsError as exc:  # the process's settings, whichever command read them
        print(f"voxgate: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:
        stop = failure(exc)
        if stop is None:
            raise
        print(f"{args.prog}: {stop[1]}{args.note and '; ' + args.note}", file=sys.stderr)
        return stop[0]


if __name__ == "__main__":
    sys.exit(main())
