"""Review of the quarantine (docs/takes-review.md): the refused takes an admin lists, listens to,
approves into the store under their key (no check: the admin heard it) or discards."""

from __future__ import annotations

import logging
import re
from typing import Literal

from aiohttp import web
from typing_extensions import TypedDict

from gateway.errors import BadRequest, NotFound
from gateway.http import keys
from gateway.speech.takes import accept_take

log = logging.getLogger("voxgate")
_ID = re.compile(r"[0-9a-f]{16}")


class RejectedTake(TypedDict):
    """One refused take: its id, the address it was made for, why it was refused, what was
    measured, when (Unix seconds) and the text it should say."""

    id: str
    key: str
    model: str
    voice: str
    reasons: list[str]
    measured: dict[str, float]
    time: float
    text: str


class RejectedTakes(TypedDict):
    """The quarantine, oldest first."""

    takes: list[RejectedTake]


class Settled(TypedDict):
    """What became of a take: ``approved`` (stored under ``key``) or ``discarded``."""

    id: str
    key: str
    outcome: str


def _id(request: web.Request) -> str:
    id_ = request.match_info["id"]
    if not _ID.fullmatch(id_):
        raise BadRequest("a take's id is 16 hex digits", param="id", code="invalid_take_id")
    return id_


def _missing(id_: str) -> NotFound:
    return NotFound(
        f"no refused take {id_} (approved, discarded or expired)", code="take_not_found"
    )


async def list_takes(request: web.Request) -> web.Response:
    """``GET /v1/takes``: the refused takes kept for review, oldest first."""
    listing = await request.app[keys.SPEECH].rejects.listing()
    body: RejectedTakes = {"takes": [r.as_json() for r in listing]}  # type: ignore[misc]
    return web.json_response(body)


async def take_audio(request: web.Request) -> web.Response:
    """``GET /v1/takes/{id}/audio``: a refused take's audio, as it would have been stored."""
    id_ = _id(request)
    found = await request.app[keys.SPEECH].rejects.get(id_)
    if found is None:
        raise _missing(id_)
    entry = found[1]
    return web.Response(
        body=entry.audio,
        content_type=entry.meta.content_type.split(";")[0],
        headers={"Cache-Control": "no-store"},
    )


async def approve_take(request: web.Request) -> web.Response:
    """``POST /v1/takes/{id}/approve``: store a refused take under its key, unchecked."""
    return await _settle(request, "approved")


async def discard_take(request: web.Request) -> web.Response:
    """``POST /v1/takes/{id}/discard``: drop a refused take."""
    return await _settle(request, "discarded")


async def _settle(request: web.Request, outcome: Literal["approved", "discarded"]) -> web.Response:
    id_ = _id(request)
    rejects = request.app[keys.SPEECH].rejects
    # An approval reads the take, stores it, then takes it out (a store that fails leaves it to
    # approve again); a discard takes it out at once (of two at once, one finds it).
    found = await (rejects.get(id_) if outcome == "approved" else rejects.pop(id_))
    if found is None:
        raise _missing(id_)
    record, entry = found
    if outcome == "approved":
        await accept_take(request.app[keys.SPEECH].store, record.key, entry, None)
        await rejects.pop(id_)
        log.warning("refused take %s approved into the store under %s", record.id, record.key)
    else:
        log.info("refused take %s for %s discarded", record.id, record.key)
    body: Settled = {"id": record.id, "key": record.key, "outcome": outcome}
    return web.json_response(body)
