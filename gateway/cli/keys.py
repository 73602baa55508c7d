"""``voxgate keys add NAME --scopes speak,read``: make an API key, print its secret once, and
append its hash to the keys file (:mod:`gateway.runtime.apikeys`)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.cli.common import Refused, add_setting_flags, command, load_settings


def append_key(path: Path, table: str, name: str) -> None:
    """Append ``table`` to the keys file at ``path`` (made if absent), atomically: the file is
    rewritten beside itself and renamed, so a gateway reloading it never reads half a key."""
    from gateway.runtime.apikeys import KeyRing, KeysFileError

    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if old.strip() and name in KeyRing.load(path).names():
        raise KeysFileError(f"API keys file {path}: a key named {name!r} exists already")
    text = old + ("\n" if old and not old.endswith("\n") else "") + ("\n" if old else "") + table
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        KeyRing.load(tmp)  # never leave a file the gateway would refuse
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cmd_keys_add(args: argparse.Namespace) -> int:
    from gateway.runtime.apikeys import key_table, new_secret

    settings = load_settings(args)
    target = args.file or settings.api_keys_file
    if not target:
        raise Refused("no keys file: pass --file PATH or set api_keys_file")
    path = Path(target).expanduser()
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    secret = new_secret()
    try:
        table = key_table(args.name, secret, scopes, args.rpm, args.cpm)
        append_key(path, table, args.name)
    except OSError as exc:  # a KeysFileError is refused as every command refuses one
        raise Refused(str(exc)) from exc
    # The secret goes to stdout once, alone on its line (scripts capture it); it is not stored.
    print(secret)
    print(
        f"key {args.name!r} added to {path} (scopes: {', '.join(scopes)}); this secret is shown "
        "only now. A running gateway picks it up on SIGHUP.",
        file=sys.stderr,
    )
    return 0


def add_command(sub: Any) -> None:
    """Register ``keys`` (``keys add``)."""
    keys = sub.add_parser("keys", help="Manage API keys (the keys file holds hashes only).")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    add = command(
        actions,
        "add",
        cmd_keys_add,
        "Make a key, print its secret once, append its hash to the keys file.",
    )
    add.add_argument("name", help="Key name (in logs and metrics): letters, digits, . _ -")
    add.add_argument("--scopes", required=True, help="Comma-separated scopes: speak, read, admin.")
    add.add_argument("--rpm", type=int, default=0, help="requests_per_minute (0: unlimited).")
    add.add_argument(
        "--cpm",
        type=int,
        default=0,
        help="chars_per_minute: characters sent to synthesis per minute (0: unlimited).",
    )
    add.add_argument("--file", default=None, help="Keys file (default: the api_keys_file setting).")
    add_setting_flags(add, only=["api_keys_file"])
