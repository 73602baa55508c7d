"""Say URLs: voice, text and extension in a URL path with no query string, and their signed form.

A dialplan plays ``Playback(http://tts:8080/v1/say/joe/Press%20one.wav)``: Asterisk's
``Playback`` splits its argument on ``&`` and FreeSWITCH takes the extension from the end of the
URL path, so the whole request is the path. ``{text}`` is one percent-encoded path segment
(``/`` as ``%2F``, ``%`` as ``%25``, ``?`` as ``%3F``, ``#`` as ``%23``, ``&`` as ``%26``); the
extension is what follows its last ``.``, so a text may hold dots ("Please hold..wav").

Players that cannot send an API key use a signed say URL,
``/v1/say/s/{token}/{voice}/{text}.{ext}``: the token is an HMAC-SHA256 (``url_signing_secret``)
over the voice, text, extension and an optional expiry (``{expires}.{mac}``, Unix seconds), so
the URL authorizes exactly that prompt and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import quote

from gateway.api.parsing import resolve_model, resolve_voice, speech_text
from gateway.errors import Forbidden
from gateway.memo import BoundedMemo
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.service import SpeechService
from gateway.speech.telephony import Extension, extension

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


def say_path(voice: str, text: str, ext: str, token: str | None = None) -> str:
    """The path of the say URL for ``text`` in ``voice`` as ``ext`` (signed with ``token``)."""
    prefix = f"/v1/say/{SIGNED}/{token}/" if token else "/v1/say/"
    return f"{prefix}{quote(voice, safe='')}/{quote(text, safe='')}.{ext}"


def parse_say(
    voice: str, text: str, ext_name: str, settings: Settings, speech: SpeechService
) -> SayParsed:
    """The request a say URL asks for, from its decoded path segments (the last one split at
    its last ``.``). The default model speaks; the voice may be an alias."""
    ext = extension(ext_name)
    model = resolve_model(settings.default_model, settings, speech)
    voice = resolve_voice(voice, model, settings, speech)
    # A say URL may carry an SSML document (percent-encoded) like any text.
    text, segments = speech_text(text, settings, speech, model, voice, param="text")
    req = SpeechRequest(
        text=text,
        model=model,
        voice=voice,
        fmt=ext.fmt,
        sample_rate=ext.rate,
        segments=segments,
    )
    return req, ext


# ---- signatures ------------------------------------------------------------------------------


def _mac(secret: str, voice: str, text: str, ext: str, expires: int) -> str:
    # One field a line: no field can hold a newline that would shift another (a voice or an
    # extension never does; a text's own newlines come before the extension's line).
    message = "\n".join(("voxgate-say-v1", voice, ext, str(expires), text)).encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(secret: str, voice: str, text: str, ext: str, expires: int | None = None) -> str:
    """The token of a signed say URL for ``voice``, ``text`` and ``ext`` (valid until the Unix
    time ``expires``, or for ever)."""
    if not secret:
        raise ValueError("url_signing_secret is empty: set it to sign say URLs")
    mac = _mac(secret, voice, text, ext, expires or 0)
    return f"{expires}.{mac}" if expires else mac


def signed_say_path(
    secret: str, voice: str, text: str, ext: str, expires: int | None = None
) -> str:
    """The path of a signed say URL (see :func:`sign`)."""
    return say_path(voice, text, ext, sign(secret, voice, text, ext, expires))


def verify(
    secret: str, token: str, voice: str, text: str, ext: str, now: float | None = None
) -> None:
    """Raise :class:`Forbidden` unless ``token`` signs ``voice``, ``text`` and ``ext`` (as
    decoded from the URL) and has not expired."""
    if not secret:
        raise Forbidden(
            "signed say URLs are off on this gateway (url_signing_secret is empty)",
            param="token",
            code="signing_disabled",
        )
    expires_s, dot, mac = token.rpartition(".")
    expires = 0
    if dot:
        # (isascii: isdigit alone takes "²", which int() refuses)
        if not (expires_s.isascii() and expires_s.isdigit()) or len(expires_s) > 12:
            raise Forbidden("malformed say URL signature", param="token", code="bad_signature")
        expires = int(expires_s)
    expected = _mac(secret, voice, text, ext, expires)
    if not hmac.compare_digest(expected.encode(), mac.encode()):
        raise Forbidden(
            "the say URL's signature does not match its voice, text and extension",
            param="token",
            code="bad_signature",
        )
    if expires and (now if now is not None else time.time()) > expires:
        raise Forbidden("the signed say URL has expired", param="token", code="url_expired")


def expiry_of(token: str) -> int:
    """The expiry (Unix seconds) a token carries, 0 for none (a verified token only)."""
    expires, dot, _ = token.rpartition(".")
    return int(expires) if dot else 0
