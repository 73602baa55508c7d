"""Provider credentials kept out of log lines and of the provider messages relayed to clients.

docs/security.md, "Provider credentials". voxgate's own log lines never hold a secret; the HTTP
clients that call providers (aiohttp, the openai SDK's httpx, botocore, ...) log what they send
at their own levels, and a provider's error text may quote the key it was sent. Each credential
an upstream is built with (its key, the other secrets its kind reads from the environment, the
user and password of its ``base_url``) is registered here; :func:`scrub` replaces each in a
text, and once :func:`install` has run every log record is scrubbed as it is made: its message
(any logger but voxgate's own) and its traceback (any logger).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

MASK = "[redacted]"
# Shorter values are not treated as secrets: replacing every "ab" would garble every line, and
# a credential that short protects nothing anyway.
MIN_SECRET_CHARS = 6
# A message clipped in the middle of a secret keeps this much of it at most.
MIN_PREFIX_CHARS = 6
_OWN_LOGGERS = "voxgate"

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()


def userinfo(url: str) -> tuple[str, ...]:
    """The user and password of ``url`` (as written and percent-decoded); empty when none."""
    try:
        parts = urlsplit(url)
        found = (parts.username or "", parts.password or "")
    except ValueError:
        return ()
    return tuple(dict.fromkeys(v for f in found if f for v in (f, unquote(f))))


def strip_userinfo(url: str) -> str:
    """``url`` without ``user:password@``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def register(values: Iterable[str]) -> None:
    """Treat each of ``values`` (and its percent-encoded form) as a secret from now on."""
    global _secrets
    new = set()
    for value in values:
        if len(value) >= MIN_SECRET_CHARS:
            new.update({value, quote(value, safe="")})
    with _lock:
        # Longest first: a secret that holds another is masked whole.
        _secrets = tuple(sorted(set(_secrets) | new, key=len, reverse=True))


def scrub(text: str) -> str:
    """``text`` with every registered secret masked, and a secret's start that ends the text
    (a message clipped inside the secret, ``...`` after it or not) masked too."""
    secrets = _secrets
    if not secrets:
        return text
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    body = text.removesuffix("...").removesuffix("\u2026")
    for secret in secrets:
        for n in range(min(len(secret) - 1, len(body)), MIN_PREFIX_CHARS - 1, -1):
            if body.endswith(secret[:n]):
                return body[:-n] + MASK + text[len(body) :]
    return text


def _scrubbed(record: logging.LogRecord) -> logging.LogRecord:
    if not record.name.startswith(_OWN_LOGGERS):
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            # Arguments that do not fit the message: left for the handler to report, as
            # logging does (raising here would raise in the library's logging call).
            message = ""
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[1] is not None:
        # Rendered once here (as a handler would) so that the traceback's text is scrubbed.
        record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
    return record


_installed: Callable[..., logging.LogRecord] | None = None


def install() -> None:
    """Scrub every log record made from now on (idempotent; nothing is scrubbed until a secret
    is registered, and then only records that hold one change)."""
    global _installed
    with _lock:
        if _installed is not None:
            return
        make = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = make(*args, **kwargs)
            return _scrubbed(record) if _secrets else record

        _installed = factory
        logging.setLogRecordFactory(factory)
