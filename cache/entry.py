"""A stored piece of audio: the bytes plus what is needed to serve and verify them."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import struct
import time
from dataclasses import dataclass, field, replace
from typing import Any

from crc32c import crc32c

# Wire layout shared by the disk and Redis tiers: a 4-byte big-endian metadata length, the metadata
# as JSON, then the audio bytes. One blob means one read (one round trip for Redis).
_LEN = struct.Struct(">I")


_CRC32C = "crc32c:"


def checksum(data: bytes | memoryview) -> str:
    """The integrity check stored with each entry and verified on read: CRC-32C of ``data``
    (why CRC-32C, and not a hash: docs/architecture.md, "Store")."""
    return f"{_CRC32C}{crc32c(data):08x}"


def matches(data: bytes | memoryview, stored: str) -> bool:
    """Whether ``data`` matches the checksum ``stored`` with it (CRC-32C, or legacy blake2b)."""
    if stored.startswith(_CRC32C):
        return checksum(data) == stored
    return hashlib.blake2b(data, digest_size=16).hexdigest() == stored


def marks_checksum(alignment: str, marks: str) -> str:
    """The checksum of an entry's speech marks (CRC-32C, as for audio), over both fields."""
    return checksum(f"{len(alignment)}:{alignment}{marks}".encode())


def body_digest(data: bytes | memoryview) -> str:
    """What names these exact bytes in HTTP: the first 128 bits of their SHA-256, in hex.

    The ETag is derived from it, not from the content address: two replicas without a shared
    store synthesize different bytes for one address (Piper samples noise), and one ETag must
    never name two bodies. Computed once when an entry is made (little beside the synthesis that
    made the bytes) and kept in its metadata, so a hit does not hash.
    """
    return hashlib.sha256(data).hexdigest()[:32]


class CorruptEntry(ValueError):
    """An entry's bytes do not match its checksum, or its blob cannot be parsed."""


class ForgedEntry(CorruptEntry):
    """A shared-tier value whose authentication tag does not verify: written by someone without
    the cache secret, or moved from another key. Never served; counted apart from rot."""


# What stored metadata may hold, checked on every read from disk or Redis: a value written by
# someone else must not smuggle a type the code does not expect (a list where a str goes), a
# megabyte of "voice", or a rate of 10**400 into the request path.
_SHORT = 256
_FORMAT = re.compile(r"[a-z0-9_]{1,16}")
_ADDRESS = re.compile(r"[0-9a-z]{64}")  # a content address (tests use other letters)
_DIGEST = re.compile(r"[0-9a-f]{32}")
_MAX_PARTS = 4096
_MAX_RATE = 384_000
# Speech marks (EntryMeta's): a minute of speech has about 1,000 marks of 60 bytes.
MAX_MARKS_CHARS = 4 << 20
_STR_FIELDS = dict.fromkeys(
    ("content_type", "checksum", "model", "voice", "digest", "marks_checksum", "master"), _SHORT
) | dict.fromkeys(("alignment", "marks"), MAX_MARKS_CHARS)


def _checked_meta(raw: object) -> EntryMeta:
    """``EntryMeta`` from parsed JSON, each field's type and size checked, or CorruptEntry."""
    if not isinstance(raw, dict) or not raw.keys() <= _META_FIELDS:
        raise CorruptEntry("entry metadata: not an object of known fields")
    for name, limit in _STR_FIELDS.items():
        value = raw.get(name, "")
        if not isinstance(value, str) or len(value) > limit:
            raise CorruptEntry(f"entry metadata: bad {name}")
    fmt, rate = raw.get("format"), raw.get("sample_rate")
    if not isinstance(fmt, str) or not _FORMAT.fullmatch(fmt):
        raise CorruptEntry("entry metadata: bad format")
    if type(rate) is not int or not 0 < rate <= _MAX_RATE:
        raise CorruptEntry("entry metadata: bad sample_rate")
    if type(raw.get("pinned", False)) is not bool:
        raise CorruptEntry("entry metadata: bad pinned")
    for name in ("created", "duration_s"):
        value = raw.get(name, 0.0)
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise CorruptEntry(f"entry metadata: bad {name}")
    pause = raw.get("pause_ms", 0)
    if type(pause) is not int or not 0 <= pause <= 60_000:
        raise CorruptEntry("entry metadata: bad pause_ms")
    digest = raw.get("digest", "")
    if digest and not _DIGEST.fullmatch(digest):  # it goes into an ETag header
        raise CorruptEntry("entry metadata: bad digest")
    master, parts = raw.get("master", ""), raw.get("parts", [])
    if master and not _ADDRESS.fullmatch(master):
        raise CorruptEntry("entry metadata: bad master")
    if (
        not isinstance(parts, list)
        or len(parts) > _MAX_PARTS
        or not all(isinstance(p, str) and _ADDRESS.fullmatch(p) for p in parts)
    ):
        raise CorruptEntry("entry metadata: bad parts")
    gaps, trims = raw.get("gaps_ms", []), raw.get("trims", [])
    if (
        not isinstance(gaps, list)
        or not isinstance(trims, list)
        or (gaps and len(gaps) != len(parts) + 1)
        or len(trims) != len(gaps)
        or not all(type(g) is int and 0 <= g <= 600_000 for g in gaps)
        or not all(type(t) is bool for t in trims)
    ):
        raise CorruptEntry("entry metadata: bad gaps_ms or trims")
    if (raw.get("alignment") or raw.get("marks")) and not raw.get("marks_checksum"):
        raise CorruptEntry("entry metadata: speech marks without their checksum")
    return EntryMeta(**raw)


@dataclass(frozen=True)
class EntryMeta:
    """What an entry is. ``voice`` and ``model`` exist so entries can be purged by voice or model.

    A rendition also records where its audio came from, so another encoding of it is a transcode
    (``GET /v1/audio/{key}.{ext}``), never a synthesis: ``master`` is the format-free address of
    the whole text (its rendition keys derive from it), ``parts`` the stored master of each
    sentence in order, joined with ``pause_ms`` of silence. Empty for masters and older entries.
    ``gaps_ms``, when not empty, replaces ``pause_ms``: the exact silence before each part and
    after the last (an SSML expansion's breaks), and ``trims`` which of those gaps take the
    edge silence off the parts beside them (:func:`synth.sentences.join_gaps`). Both are left
    out of the blob when empty, so entries of plain text are stored exactly as before.
    """

    content_type: str
    format: str
    sample_rate: int
    checksum: str
    model: str = ""
    voice: str = ""
    created: float = field(default_factory=time.time)
    pinned: bool = False
    duration_s: float = 0.0
    master: str = ""
    parts: tuple[str, ...] = ()
    pause_ms: int = 0
    gaps_ms: tuple[int, ...] = ()
    trims: tuple[bool, ...] = ()
    digest: str = ""  # body_digest(audio); empty in entries stored before it existed
    # Speech marks (docs/speech-marks.md): a master's ``alignment`` (its words' timings as JSON,
    # :mod:`synth.alignment`), a rendition's ``marks`` (Polly's NDJSON, offsets into the text),
    # and the checksum over both, verified with the audio's. Empty: none (left out of the blob).
    alignment: str = ""
    marks: str = ""
    marks_checksum: str = ""

    def __post_init__(self) -> None:
        # JSON gives a list back; keep the frozen value hashable and equal to what was stored.
        for name in ("parts", "gaps_ms", "trims"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(getattr(self, name)))


_META_NAMES = tuple(EntryMeta.__dataclass_fields__)  # in field order
_META_FIELDS = frozenset(_META_NAMES)


@dataclass(frozen=True)
class Entry:
    """Audio bytes and their metadata."""

    audio: bytes
    meta: EntryMeta

    @classmethod
    def create(
        cls, audio: bytes, *, fmt: str, alignment: str = "", marks: str = "", **fields: Any
    ) -> Entry:
        """Build an entry, computing its checksums; ``fields`` are the rest of
        :class:`EntryMeta`'s (``content_type`` and ``sample_rate`` are required)."""
        meta = EntryMeta(
            format=fmt,
            checksum=checksum(audio),
            digest=body_digest(audio),
            alignment=alignment,
            marks=marks,
            marks_checksum=marks_checksum(alignment, marks) if alignment or marks else "",
            **fields,
        )
        return cls(audio=audio, meta=meta)

    @property
    def size(self) -> int:
        """Bytes of audio held (and of speech marks: a memory tier bounds both)."""
        return len(self.audio) + len(self.meta.alignment) + len(self.meta.marks)

    @functools.cached_property
    def etag(self) -> str:
        """The strong entity tag of these bytes (from :func:`body_digest`; hashed here, once,
        for an entry stored before the digest was kept)."""
        return f'"{self.meta.digest or body_digest(self.audio)}"'

    def pinned_copy(self) -> Entry:
        """The same entry, pinned."""
        return replace(self, meta=replace(self.meta, pinned=True))

    def verify(self) -> None:
        """Raise :class:`CorruptEntry` when the audio does not match the stored checksum."""
        if not matches(self.audio, self.meta.checksum):
            raise CorruptEntry("checksum mismatch")
        meta = self.meta
        if (meta.alignment or meta.marks) and marks_checksum(
            meta.alignment, meta.marks
        ) != meta.marks_checksum:
            raise CorruptEntry("speech marks checksum mismatch")

    def blob_head(self) -> bytes:
        """The blob's bytes before the audio: the metadata's length and the metadata."""
        # A shallow dict, in field order (what asdict gives, without its deep copy of every
        # tuple, a visible share of a disk put).
        meta_ = self.meta
        fields = {name: getattr(meta_, name) for name in _META_NAMES}
        for name in ("gaps_ms", "trims", "alignment", "marks", "marks_checksum"):
            if not fields[name]:
                del fields[name]  # plain text's blobs stay readable by earlier versions
        meta = json.dumps(fields, separators=(",", ":")).encode()
        return _LEN.pack(len(meta)) + meta

    def to_blob(self) -> bytes:
        """Serialize for a byte-oriented tier."""
        return self.blob_head() + self.audio

    @classmethod
    def from_blob(cls, blob: bytes | memoryview, *, verify: bool = True) -> Entry:
        """Parse a blob written by :meth:`to_blob` and verify its checksums (``verify=False``:
        the tier checked the whole blob its own way, the disk's CRC-32C or Redis's HMAC)."""
        try:
            meta = read_meta(blob)
        except HeadTooShort:
            raise CorruptEntry("entry metadata longer than the entry") from None
        (n,) = _LEN.unpack_from(blob, 0)
        entry = cls(audio=bytes(blob[_LEN.size + n :]), meta=meta)
        if verify:
            entry.verify()
        return entry


class HeadTooShort(CorruptEntry):
    """The first bytes read of a blob end before its metadata does: ``needed`` bytes hold it
    (speech marks make metadata longer than a purge scan's first read)."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"blob head too short: need {needed} bytes")
        self.needed = needed


# Longest metadata a blob may have: its fields, and both speech marks fields at their bound.
MAX_META_BYTES = 64 * 1024 + 2 * 4 * MAX_MARKS_CHARS


def read_meta(head: bytes | memoryview) -> EntryMeta:
    """The metadata of a blob from its first bytes only (a purge scan need not fetch the audio).

    Raises :class:`CorruptEntry` when ``head`` is unreadable or too short to hold the metadata.
    """
    try:
        (n,) = _LEN.unpack_from(head, 0)
        if len(head) < _LEN.size + n:
            raise HeadTooShort(_LEN.size + n)
        return _checked_meta(json.loads(bytes(head[_LEN.size : _LEN.size + n])))
    except (struct.error, ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, CorruptEntry):
            raise
        raise CorruptEntry(f"unreadable entry: {type(exc).__name__}") from exc
