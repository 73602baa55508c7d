"""Content addressing: what a piece of audio *is*, as a 256-bit key.

The key is computed on the server only. Two requests share a key exactly when they would produce
the same audio: same normalized text, same engine + voice + model weights (by fingerprint), same
synthesis parameters, same output format and sample rate. Anything that changes the sound is in the
key; anything that does not (leading/trailing whitespace, runs of spaces, Unicode composition form)
is normalized away so it does not split the cache.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

# Bump when the canonical encoding or the normalization changes: old entries then stop matching
# instead of being served for requests they were not made for.
KEY_SCHEMA_VERSION = 1

# A content address as a JSON Schema pattern (the API's documents state it so).
KEY_PATTERN = "^[0-9a-f]{64}$"
_KEY_RE = re.compile(KEY_PATTERN[1:-1])
_WHITESPACE_RE = re.compile(r"\s+")

ParamValue = str | int | float | bool | None


def normalize_text(text: str) -> str:
    """NFC-normalize and collapse whitespace. Case and punctuation are kept: they change speech."""
    return _WHITESPACE_RE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def _address(value: Mapping[str, Any]) -> str:
    # Sorted keys, no whitespace, floats in repr form: one byte string per logical value.
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=32).hexdigest()


def master_key(
    *,
    text: str,
    engine: str,
    voice: str,
    fingerprint: str,
    params: Mapping[str, ParamValue],
    expansion: Sequence[Sequence[object]] = (),
) -> str:
    """Key of the canonical (format-free) rendering: the engine's own PCM at its own rate.

    ``text`` must already be normalized with :func:`normalize_text`; ``fingerprint`` identifies the
    model weights and config, so a new model never serves old audio. ``expansion`` is an SSML
    expansion's segments (words, pause, rate, phonemes) when plain text cannot stand for it; it
    joins the material only then, so plain text keeps the address it always had.
    """
    material: dict[str, object] = {
        "v": KEY_SCHEMA_VERSION,
        "kind": "master",
        "text": text,
        "engine": engine,
        "voice": voice,
        "fingerprint": fingerprint,
        "params": dict(params),
    }
    if expansion:
        material["expansion"] = [list(segment) for segment in expansion]
    return _address(material)


def rendition_key(master: str, *, fmt: str, sample_rate: int) -> str:
    """Key of one encoded rendition (format + sample rate) of the master ``master``."""
    material = {
        "v": KEY_SCHEMA_VERSION,
        "kind": "rendition",
        "master": master,
        "format": fmt,
        "rate": sample_rate,
    }
    return _address(material)


def is_key(value: str) -> bool:
    """True when ``value`` has the shape of a content address (64 lowercase hex digits).

    ``fullmatch``: ``$`` in a ``match`` also accepts a trailing newline, which a percent-encoded
    ``%0A`` in a URL puts there."""
    return _KEY_RE.fullmatch(value) is not None


def revision_fingerprint(fingerprint: str, revision: str) -> str:
    """The fingerprint a model's content addresses carry once a rollout switched it to
    ``revision`` (``voxgate rollout``): a new address for every text, beside the old ones."""
    material = f"{fingerprint}\0revision\0{revision}".encode()
    return hashlib.blake2b(material, digest_size=32).hexdigest()
