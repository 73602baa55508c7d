"""Say URLs: voice, text and extension in a URL path with no query string, and their signed form.

The whole request is the path: Asterisk's ``Playback`` splits its argument on ``&`` and
FreeSWITCH takes the extension from the end of the URL path. Both forms, their encoding and the
signed form's token: docs/telephony.md, "Say URLs" and "Signed say URLs". ``~`` is in no key
name (letters, digits, ``.``, ``_``, ``-``), and the key is empty when the gateway had no keys file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import quote

from gateway.api.parsing import (
    ExpansionMemo,
    build_request,
    resolve_model,
    resolve_voice,
    speech_text,
)
from gateway.errors import Forbidden
from gateway.memo import BoundedMemo
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.telephony import Extension, extension
from gateway.speech.vocabulary import Vocabulary

SIGNED = "s"  # /v1/say/s/{token}/...: "s" is never a voice's URL segment there

# Longest say-URL path remembered by the memo (longer ones are parsed each time).
MEMO_MAX_PATH = 2048

SayParsed = tuple[SpeechRequest, Extension]


class SayMemo(BoundedMemo[str, SayParsed]):
    """Validated say URLs by their path as sent, so a repeated URL costs one dict lookup. Only
    valid URLs are kept (a signed one once verified), and only short ones."""

    def __init__(self, size: int = 4096) -> None:
        super().__init__(size)

    def put(self, key: str, value: SayParsed) -> None:
        """Remember ``value`` for the path ``key`` (short ones only)."""
        if len(key) <= MEMO_MAX_PATH:
            super().put(key, value)


def parse_say(
    voice: str,
    text: str,
    ext_name: str,
    settings: Settings,
    words: Vocabulary,
    expansions: ExpansionMemo | None = None,
) -> SayParsed:
    """The request a say URL asks for, from its decoded path segments (the last one split at
    its last ``.``). The default model speaks; the voice may be an alias."""
    ext = extension(ext_name)
    model = resolve_model(words.default_model, words)
    voice = resolve_voice(voice, model, words)
    # A say URL may carry an SSML document (percent-encoded) like any text.
    spoken = speech_text(text, settings, words, model, voice, param="text", expansions=expansions)
    req = build_request(spoken, model=model, voice=voice, fmt=ext.fmt, sample_rate=ext.rate)
    return req, ext


_SEP = "~"


@dataclass(frozen=True, slots=True)
class Signed:
    """What a verified token says: who signed it, and until when it plays."""

    key: str  # the signing API key's name ("" when the gateway had no keys file)
    expires: int  # Unix seconds


def _mac(secret: str, voice: str, text: str, ext: str, expires: int, key: str) -> str:
    # One field a line: no field can hold a newline that would shift another (a voice, an
    # extension or a key name never does; a text's own newlines come last).
    message = "\n".join(("voxgate-say-v2", key, voice, ext, str(expires), text)).encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(secret: str, voice: str, text: str, ext: str, expires: int, key: str = "") -> str:
    """The token of a signed say URL for ``voice``, ``text`` and ``ext``, valid until the Unix
    time ``expires``, charged to the API key named ``key``."""
    if not secret:
        raise ValueError("url_signing_secret is empty: set it to sign say URLs")
    if expires <= 0:
        raise ValueError("a signed say URL needs an expiry")
    if _SEP in key:
        raise ValueError(f"a key name holds no {_SEP!r}")
    mac = _mac(secret, voice, text, ext, expires, key)
    return f"{expires}{_SEP}{key}{_SEP}{mac}"


def signed_say_path(
    secret: str, voice: str, text: str, ext: str, expires: int, key: str = ""
) -> str:
    """The path of a signed say URL (see :func:`sign`)."""
    token = sign(secret, voice, text, ext, expires, key)
    return f"/v1/say/{SIGNED}/{token}/{quote(voice, safe='')}/{quote(text, safe='')}.{ext}"


def verify(secret: str, token: str, voice: str, text: str, ext: str) -> Signed:
    """Who signed ``token`` and until when, or :class:`Forbidden` unless it signs ``voice``,
    ``text`` and ``ext`` (as decoded from the URL) and has not expired."""
    if not secret:
        raise Forbidden(
            "signed say URLs are off on this gateway (url_signing_secret is empty)",
            param="token",
            code="signing_disabled",
        )
    parts = token.split(_SEP)
    # (isascii: isdigit alone takes "²", which int() refuses)
    if len(parts) != 3 or not (parts[0].isascii() and parts[0].isdigit()) or len(parts[0]) > 12:
        raise Forbidden(
            "malformed say URL signature (a URL signed without an expiry or a key by an older "
            "version must be signed again)",
            param="token",
            code="bad_signature",
        )
    expires_s, key, mac = parts
    expires = int(expires_s)
    expected = _mac(secret, voice, text, ext, expires, key)
    if not hmac.compare_digest(expected.encode(), mac.encode()):
        raise Forbidden(
            "the say URL's signature does not match its voice, text and extension",
            param="token",
            code="bad_signature",
        )
    if time.time() > expires:
        raise Forbidden("the signed say URL has expired", param="token", code="url_expired")
    return Signed(key, expires)


def signer_of(token: str) -> Signed:
    """What a token already verified says (its fields, without checking the HMAC again)."""
    expires, key, _ = token.split(_SEP)
    return Signed(key, int(expires))
