"""``voxgate sign-url VOICE TEXT EXT``: a signed say URL for a player that cannot send an API key
(the signature: :mod:`gateway.api.say`)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from gateway.cli.common import Refused, add_setting_flags, command, load_settings


def cmd_sign_url(args: argparse.Namespace) -> int:
    from gateway.api.say import signed_say_path
    from gateway.speech.telephony import EXTENSIONS

    settings = load_settings(args)
    secret = settings.url_signing_secret.get_secret_value()
    if not secret:
        raise Refused("url_signing_secret is empty: set it first")
    if args.ext not in EXTENSIONS:
        raise Refused(f"unknown extension {args.ext!r}; supported: {', '.join(EXTENSIONS)}")
    ttl = args.expires_in if args.expires_in is not None else settings.signed_url_ttl_s
    if not 1 <= ttl <= settings.signed_url_max_s:
        raise Refused(
            f"--expires-in must be 1 to {settings.signed_url_max_s} seconds (signed_url_max_s)"
        )
    if settings.api_keys_file:
        # The URL is charged to a key, and stops playing once that key is gone from the file.
        from gateway.runtime.apikeys import KeyRing

        ring = KeyRing.load(settings.api_keys_file)  # a bad file: KeysFileError, refused
        key = ring.named(args.key) if args.key else None
        if key is None or "speak" not in key.scopes:
            raise Refused(
                "with an API keys file, --key must name a key of it with the speak scope (the "
                f"URL's fetches are charged to it); keys: {', '.join(ring.names())}"
            )
    elif args.key:
        raise Refused("--key needs an API keys file (api_keys_file)")
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
    sign = command(
        sub,
        "sign-url",
        cmd_sign_url,
        "Print a signed say URL (/v1/say/s/...) that plays TEXT in VOICE without an API key.",
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
