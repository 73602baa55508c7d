"""HTTP caching semantics for audio responses: ETag, If-None-Match (304), If-Modified-Since,
Cache-Control, Range (206 / 416).

Why the ETag names the bytes, not the content address (:meth:`cache.entry.Entry.etag`):
docs/api.md, "Caching headers and conditional requests". So a matching ``If-None-Match`` is
answered 304 only against the entry held now, and byte ranges of a stored entry are always
consistent with one another. ``Last-Modified`` (when the entry was stored) is for players that
revalidate by date (Twilio).
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping

from aiohttp import web

from gateway.errors import BadRequest
from gateway.http.errors import error_response


def cache_control(max_age_s: int) -> str:
    """``Cache-Control`` for audio players may keep ``max_age_s`` seconds (Asterisk, FreeSWITCH,
    Twilio and Bandwidth keep a fetched file fresh only with ``max-age``)."""
    if max_age_s <= 0:
        return "no-cache"
    return f"public, max-age={max_age_s}"


def http_date(timestamp: float) -> str:
    """``timestamp`` as an HTTP date (RFC 9110 IMF-fixdate)."""
    return email.utils.formatdate(timestamp, usegmt=True)


def not_modified_since(request: web.Request, created: float) -> bool:
    """True when ``If-Modified-Since`` is at or after ``created`` (answer 304).

    Ignored when ``If-None-Match`` is present (RFC 9110 13.1.3) or the date does not parse."""
    header = request.headers.get("If-Modified-Since")
    if not header or "If-None-Match" in request.headers:
        return False
    try:
        since = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return False
    if since.tzinfo is None:
        return False
    return int(created) <= since.timestamp()


def none_match(request: web.Request, etag: str) -> bool:
    """True when ``If-None-Match`` names ``etag`` (or is ``*``: the audio exists): answer 304.

    If-None-Match uses the weak comparison (RFC 9110 13.1.2), so ``W/"key"`` matches too.
    """
    tags = (raw.strip() for raw in request.headers.get("If-None-Match", "").split(","))
    return any(tag == "*" or tag.removeprefix("W/") == etag for tag in tags)


def not_modified(headers: Mapping[str, str]) -> web.Response:
    """A 304 carrying the validators and caching headers a 200 would have had."""
    keep = ("ETag", "Cache-Control", "Last-Modified", "X-Audio-Key", "X-Cache", "Vary")
    return web.Response(status=304, headers={k: v for k, v in headers.items() if k in keep})


class RangeError(ValueError):
    """The Range header asks for bytes the entity does not have (answer 416)."""


def _digits(text: str) -> bool:
    """ASCII digits only, and few enough for ``int``: ``str.isdigit`` also takes ``²`` and
    Arabic-Indic digits, which ``int`` refuses or reads (a 500 before), and 4,300 digits are
    beyond ``int``'s limit. 18 digits is an exabyte, more than any entry."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """The inclusive ``(first, last)`` byte positions of a single-range ``bytes=`` header.

    Returns None when the header should be ignored (not a bytes unit, several ranges, or syntax
    we do not take): RFC 9110 lets a server answer such requests with the whole entity. Raises
    :class:`RangeError` when the range is well formed but unsatisfiable.
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first_s, dash, last_s = spec.strip().partition("-")
    if not dash:
        return None
    first_s, last_s = first_s.strip(), last_s.strip()
    if not (_digits(first_s) or first_s == "") or not (_digits(last_s) or last_s == ""):
        return None
    if first_s == "":
        if last_s == "":
            return None
        suffix = int(last_s)  # bytes=-N: the last N bytes
        if suffix == 0 or size == 0:
            raise RangeError(header)
        return max(0, size - suffix), size - 1
    first = int(first_s)
    if last_s and int(last_s) < first:
        return None  # invalid syntax: ignore the header (RFC 9110 14.1.1)
    if first >= size:
        raise RangeError(header)
    last = int(last_s) if last_s else size - 1
    return first, min(last, size - 1)


def audio_response(
    request: web.Request,
    body: bytes,
    headers: dict[str, str],
    *,
    ranges: bool = False,
    created: float | None = None,
) -> web.Response:
    """A full (200), partial (206), 304 or 416 response for immutable ``body``: aiohttp's own
    ``web.Response``. (A class of our own that sent a large body's headers in their own write on
    asyncio's loop saved only 2-3% of a bare server's CPU per 270 KB response,
    docs/bench/handmade_send.json; a memory hit has its own writer, :mod:`gateway.http.hits`.)

    ``headers`` must carry the ``ETag``. ``Content-Length`` is always set (aiohttp does it for a
    bytes body). With ``ranges`` the response advertises and honours byte ranges. With ``created``
    (when the entry was stored) an If-Modified-Since at or after it is answered 304.
    """
    etag = headers["ETag"]
    if none_match(request, etag):
        return not_modified(headers)
    if created is not None and not_modified_since(request, created):
        return not_modified(headers)
    if not ranges:
        return web.Response(body=body, headers=headers)
    headers = {**headers, "Accept-Ranges": "bytes"}
    header = request.headers.get("Range")
    if_range = request.headers.get("If-Range")
    if header is None or (if_range is not None and if_range.strip() != etag):
        return web.Response(body=body, headers=headers)
    size = len(body)
    try:
        span = parse_range(header, size)
    except RangeError:
        message = f"range not satisfiable: the audio is {size} bytes"
        error = BadRequest(message, param="Range", code="range_not_satisfiable")
        return error_response(error, 416, {"Content-Range": f"bytes */{size}", "ETag": etag})
    if span is None:
        return web.Response(body=body, headers=headers)
    first, last = span
    headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return web.Response(body=body[first : last + 1], status=206, headers=headers)
