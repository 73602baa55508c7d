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
    expires = int(time.time()) + args.expires_in if args.expires_in else None
    path = signed_say_path(secret, args.voice, args.text, args.ext, expires)
    url = settings.public_url + path
    if args.json:
        print(json.dumps({"url": url, "expires": expires}))
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
        "--expires-in", type=int, default=0, help="Seconds the URL stays valid (0: for ever)."
    )
    sign.add_argument("--json", action="store_true", help="Print {url, expires} as JSON.")
    add_setting_flags(sign, only=["url_signing_secret", "public_url"])
    sign.set_defaults(func=cmd_sign_url)
