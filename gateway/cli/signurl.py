"""``voxgate sign-url VOICE TEXT EXT``: a signed say URL for a player that cannot send an API key
(the signature: :mod:`gateway.api.say`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gateway.cli.common import add_setting_flags, load_settings


def cmd_sign_url(args: argparse.Namespace) -> int:
    from gateway.api.say import signed_say_path
    from gateway.speech.telephony import EXTENSIONS

    settings = load_settings(args)
    secret = settings.url_signing_secret.get_secret_value()
    if not secret:
        print("voxgate sign-url: url_signing_secret is empty: set it first", file=sys.stderr)
        return 2
    if args.ext not in EXTENSIONS:
        print(
            f"voxgate sign-url: unknown extension {args.ext!r}; supported: {', '.join(EXTENSIONS)}",
            file=sys.stderr,
        )
        return 2
    ttl = args.expires_in if args.expires_in is not None else settings.signed_url_ttl_s
    if not 1 <= ttl <= settings.signed_url_max_s:
        print(
            f"voxgate sign-url: --expires-in must be 1 to {settings.signed_url_max_s} seconds "
            "(signed_url_max_s)",
            file=sys.stderr,
        )
        return 2
    if settings.api_keys_file:
        # The URL is charged to a key, and stops playing once that key is gone from the file.
        from gateway.runtime.apikeys import KeyRing, KeysFileError

        try:
            ring = KeyRing.load(settings.api_keys_file)
        except KeysFileError as exc:
            print(f"voxgate sign-url: {exc}", file=sys.stderr)
            return 2
        key = ring.named(args.key) if args.key else None
        if key is None or "speak" not in key.scopes:
            print(
                "voxgate sign-url: with an API keys file, --key must name a key of it with the "
                f"speak scope (the URL's fetches are charged to it); keys: {', '.join(ring.names())}",
                file=sys.stderr,
            )
            return 2
    elif args.key:
        print("voxgate sign-url: --key needs an API keys file (api_keys_file)", file=sys.stderr)
        return 2
    expires = int(time.time()) + ttl
    path = signed_say_path(secret, args.voice, args.text, args.ext, expires, args.key)
    url = settings.public_url + path
    if args.json:
        print(json.dumps({"url": url, "expires": expires, "key": args.key or None}))
    else:
        print(url)
    return 0


def add_command(sub: Any) -> None:
    """Register ``sign-url``."""
    sign = sub.add_parser(
        "sign-url",
        help="Print a signed say URL (/v1/say/s/...) that plays TEXT in VOICE without an API key.",
    )
    sign.add_argument("voice", help="Voice or alias, as the URL will name it.")
    sign.add_argument("text", help="Text to speak.")
    sign.add_argument("ext", help="Extension: wav, ulaw, sln16, ... (see docs/telephony.md).")
    sign.add_argument(
        "--expires-in",
        type=int,
        default=None,
        help="Seconds the URL stays valid (default: signed_url_ttl_s, 30 days; at most "
        "signed_url_max_s).",
    )
    sign.add_argument(
        "--key",
        default="",
        help="Name of the API key the URL's fetches are charged to (required with an API keys "
        "file; the URL answers 403 once that key is gone from it).",
    )
    sign.add_argument("--json", action="store_true", help="Print {url, expires, key} as JSON.")
    add_setting_flags(
        sign,
        only=[
            "url_signing_secret",
            "public_url",
            "api_keys_file",
            "signed_url_ttl_s",
            "signed_url_max_s",
        ],
    )
    sign.set_defaults(func=cmd_sign_url)
