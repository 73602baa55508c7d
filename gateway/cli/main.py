"""The ``voxgate`` command: one module per command group beside this one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.cli import audit, cache, config, export, keys, rollout, say, serve, signurl, tune, warm
from gateway.cli.common import EXIT_REFUSED, failure
from gateway.runtime.settings import SettingsError


def build_parser() -> argparse.ArgumentParser:
    """The ``voxgate`` argument parser."""
    parser = argparse.ArgumentParser(prog="voxgate", description="Cached text-to-speech gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (serve, say, warm, rollout, export, signurl, keys, cache, audit, config, tune):
        group.add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``voxgate`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # for `serve --workers N`
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
