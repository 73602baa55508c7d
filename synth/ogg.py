"""Ogg files whose bytes follow from their audio alone.

libsndfile numbers each Ogg stream it writes with a serial from a generator it seeds from the
clock, and offers no way to set it; the serial is in every page's header, under its checksum.
So one Opus rendition encoded twice (two replicas, or once again after eviction) differed in 8
bytes a page, and had two ETags. :func:`fixed_serial` sets every page's serial from the file's
own content (and recomputes each page's checksum): docs/synthesis.md, "One sound per address".
"""

from __future__ import annotations

import hashlib
import struct
import zlib

_CAPTURE = b"OggS"
_HEADER = 27  # bytes before a page's segment table
_SERIAL_AT, _CRC_AT, _SEGMENTS_AT = 14, 22, 26
# Each byte with its bits in reverse order: Ogg's CRC-32 is zlib's, bit-reflected.
_REVERSED = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


def ogg_crc(page: bytes) -> int:
    """Ogg's page checksum of ``page`` (its checksum field zero): CRC-32, polynomial
    0x04C11DB7, not reflected, no initial or final XOR. zlib computes the reflected CRC with
    both XORs: over the bit-reversed bytes, with the XORs' share taken out, it is this one's
    bits reversed."""
    reflected = zlib.crc32(page.translate(_REVERSED)) ^ zlib.crc32(bytes(len(page)))
    return int(f"{reflected:032b}"[::-1], 2)


def _pages(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of each page; ValueError where ``data`` is not whole Ogg pages."""
    pages = []
    at = 0
    while at < len(data):
        if data[at : at + 4] != _CAPTURE or at + _HEADER > len(data):
            raise ValueError(f"no Ogg page at byte {at}")
        segments = data[at + _SEGMENTS_AT]
        table = data[at + _HEADER : at + _HEADER + segments]
        end = at + _HEADER + segments + sum(table)
        if len(table) < segments or end > len(data):
            raise ValueError(f"truncated Ogg page at byte {at}")
        pages.append((at, end))
        at = end
    return pages


def fixed_serial(data: bytes) -> bytes:
    """``data`` (one logical Ogg stream, as libsndfile writes it) with the serial of every page
    set to the first 4 bytes of blake2b over the pages' content (headers but serial and
    checksum, and bodies), and each page's checksum made anew."""
    pages = _pages(data)
    digest = hashlib.blake2b(digest_size=4)
    for start, end in pages:
        digest.update(data[start : _SERIAL_AT + start])
        digest.update(data[start + _CRC_AT + 4 : end])
    serial = digest.digest()
    out = bytearray(data)
    for start, end in pages:
        out[start + _SERIAL_AT : start + _SERIAL_AT + 4] = serial
        out[start + _CRC_AT : start + _CRC_AT + 4] = bytes(4)
        crc = ogg_crc(bytes(out[start:end]))
        out[start + _CRC_AT : start + _CRC_AT + 4] = struct.pack("<I", crc)
    return bytes(out)
