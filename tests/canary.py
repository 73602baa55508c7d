"""Canary secrets: every secret the tests hand voxgate (a provider's key, a client's API key, a
URL signing secret) holds :data:`MARKER` and a tail, and tests/conftest.py fails a test in whose
log records or answer bodies one shows up; :class:`tests.ops_support.ServerProcess` searches a
``voxgate serve`` log when it closes it. docs/security.md, "Canaries in the tests"."""

from __future__ import annotations

import hashlib
import re

MARKER = "canary-"
# A canary: the marker and at least 12 letters or digits (a word like "canary-parser" is none).
_PATTERN = re.compile(r"[\w.-]*canary-[0-9A-Za-z]{12,}")

# Where a canary was seen during the running test ("the body of GET http://..." and the canary).
seen: list[str] = []
# Why the running test may show one (its ``canary_allowed`` mark): it is not failed for them.
allowed = ""
# The answer bodies being read (by id, the stream held so that its id is not reused while the
# test runs): where each is from, and its last bytes (a canary may span two chunks).
streams: dict[int, tuple[object, str, bytearray]] = {}
_SPAN = 128  # longer than any canary
# The ports of the tests' fake providers (tests/upstream_support.py): what a provider answers is
# the provider's own text (one quotes the key it was sent), not voxgate's answer.
provider_ports: set[int] = set()


def canary(label: str) -> str:
    """A secret for ``label``: ``label-canary-`` and 16 hex digits (the same every run)."""
    return f"{label}-{MARKER}{hashlib.sha256(label.encode()).hexdigest()[:16]}"


def found(text: str | bytes) -> list[str]:
    """The canaries in ``text``."""
    if isinstance(text, bytes):
        if MARKER.encode() not in text:
            return []
        text = text.decode(errors="replace")
    elif MARKER not in text:
        return []
    return _PATTERN.findall(text)


def note(where: str, text: str | bytes) -> list[str]:
    """Note each canary in ``text`` as seen ``where``, and return them."""
    hits = found(text)
    seen.extend(e for e in dict.fromkeys(f"{where}: {hit}" for hit in hits) if e not in seen)
    return hits


def watch(stream: object, where: str) -> None:
    """Search what is read from ``stream`` from now on (:func:`note_chunk`), as ``where``."""
    streams.setdefault(id(stream), (stream, where, bytearray()))


def note_chunk(stream: object, data: bytes) -> None:
    """Note each canary in ``data``, the next chunk read from ``stream`` if it is watched."""
    entry = streams.get(id(stream))
    if entry is None or not data:
        return
    _, where, tail = entry
    note(where, data)
    note(where, bytes(tail) + data[:_SPAN])  # a canary across the boundary
    tail[:] = data[-_SPAN:] if len(data) >= _SPAN else (bytes(tail) + data)[-_SPAN:]


def shown() -> list[str]:
    """What was seen, less the start of a canary that a chunk cut (seen whole at the next)."""
    return [e for e in seen if not any(o != e and o.startswith(e) for o in seen)]
