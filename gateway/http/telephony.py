"""What PBXs and hosted players fetch: stored audio in a telephony encoding by extension
(``GET /v1/audio/{key}.{ext}``) and say URLs (``GET /v1/say/{voice}/{text}.{ext}``, signed:
``GET /v1/say/s/{token}/{voice}/{text}.{ext}``). Encodings: :mod:`gateway.speech.telephony`;
say URLs and signatures: :mod:`gateway.api.say`.

Say URLs carry request text in the path: the access log writes only the route template, never
the URL, so the text does not reach the logs.
"""

from __future__ import annotations

import functools
import time
from typing import Annotated

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from gateway.api.models import models_for
from gateway.api.parsing import read_json_object, validate_off_loop
from gateway.api.say import SayParsed, parse_say, signed_say_path, signer_of, verify
from gateway.errors import BadRequest, Forbidden, NotFound
from gateway.http import keys
from gateway.http.charging import charged
from gateway.http.conditional import audio_response
from gateway.http.delivery import client_of, serve_speech
from gateway.http.hits import hit_response
from gateway.http.marks import audio_key
from gateway.speech.caller import ask_as, caller
from gateway.speech.telephony import extension


class SignedUrl(TypedDict):
    """A signed say URL."""

    url: Annotated[str, Field(description="Absolute with public_url (else the path).")]
    path: str
    expires: Annotated[int, Field(description="Unix seconds.")]
    key: Annotated[str | None, Field(description="The API key it is charged to.")]


async def audio_by_key_ext(request: web.Request) -> web.StreamResponse:
    """``GET /v1/audio/{key}.{ext}``: the audio stored under ``key`` in the encoding ``ext``
    names, transcoded from its masters (never synthesized) and stored for the next player."""
    ext = extension(request.match_info["ext"])
    key = audio_key(request)
    app = request.app
    ask_as(client_of(request))  # a transcode made for it takes this client's share
    present = app[keys.PRESENTATIONS].by_key[ext.name]
    transcoder = app[keys.SPEECH].transcoder
    known = transcoder.known_key(key, ext)
    if known is not None:
        # A conditional request (Asterisk revalidates with HEAD + If-None-Match) is answered
        # below against the entry held now: the key alone does not say which bytes it names.
        entry = app[keys.STORE].get_memory(known)
        if entry is not None and not _conditional(request):
            request[keys.CACHE_RESULT] = "hit"
            request[keys.AUDIO_KEY] = known
            return hit_response(request, entry.audio, present.hit_headers(known, ext.fmt, entry))
    got = await transcoder.get(key, ext)
    if got is None:
        raise NotFound(f"no audio stored under key {key}", param="key")
    request[keys.CACHE_RESULT] = got.cache
    request[keys.AUDIO_KEY] = got.key
    meta = got.entry.meta
    headers = present.headers(
        got.key, ext.fmt, meta.sample_rate, got.cache, meta.created, got.entry.etag
    )
    return audio_response(request, got.entry.audio, headers, ranges=True, created=meta.created)


def _conditional(request: web.Request) -> bool:
    headers = request.headers
    return "If-None-Match" in headers or "If-Modified-Since" in headers or "Range" in headers


async def say(request: web.Request) -> web.StreamResponse:
    """``GET /v1/say/{voice}/{text}.{ext}``: speak ``text`` in ``voice`` as ``ext``.

    A repeated URL is one memo lookup by the path exactly as sent (one string: no segments to
    pick out and hash), then the memory hit of :func:`serve_speech`."""
    raw = request.raw_path
    memo = request.app[keys.SAY_MEMO]
    parsed = memo.get(raw)
    if parsed is None:
        parsed = await _parse(request)
        memo.put(raw, parsed)
    return await _play(request, parsed)


async def say_signed(request: web.Request) -> web.StreamResponse:
    """``GET /v1/say/s/{token}/{voice}/{text}.{ext}``: a say URL that authorizes itself, charged
    to the API key that signed it (403 once that key is gone from the keys file)."""
    app = request.app
    match = request.match_info
    token, voice, text, ext_name = match["token"], match["voice"], match["text"], match["ext"]
    raw = request.raw_path  # (holds the token: a URL is remembered once verified)
    memo = app[keys.SAY_MEMO]
    parsed = memo.get(raw)
    if parsed is None:
        signed = verify(_secret(request), token, voice, text, ext_name)
        parsed = await _parse(request)
        memo.put(raw, parsed)
    else:
        # (Remembered only once verified: what is left to check is the clock.)
        signed = signer_of(token)
        if time.time() > signed.expires:
            raise Forbidden("the signed say URL has expired", param="token", code="url_expired")
    play = functools.partial(_play, parsed=parsed)
    ring = app[keys.AUTH].ring
    if ring is None:
        return await play(request)
    key = ring.named(signed.key) if signed.key else None
    if key is None or "speak" not in key.scopes:
        raise Forbidden(
            "the API key that signed this say URL is no longer valid here: sign it again",
            param="token",
            code="signer_revoked",
        )
    return await charged(request, key, play)


async def sign_say_url(request: web.Request) -> web.Response:
    """``POST /v1/say/sign``: a signed say URL for ``{voice, text, ext, expires_in}`` (what
    ``voxgate sign-url`` prints), for players that cannot send an API key."""
    app = request.app
    settings = app[keys.SETTINGS]
    raw = await read_json_object(request, app[keys.MAX_BODY_BYTES], settings.body_timeout_s)
    body = models_for(settings).sign.check(raw)
    secret = _secret(request)
    if not secret:
        raise Forbidden(
            "signed say URLs are off on this gateway (url_signing_secret is empty)",
            code="signing_disabled",
        )
    ttl = body.expires_in if body.expires_in is not None else settings.signed_url_ttl_s
    if ttl > settings.signed_url_max_s:
        raise BadRequest(
            f"expires_in {ttl} is longer than this gateway signs for "
            f"({settings.signed_url_max_s} s, signed_url_max_s)",
            param="expires_in",
        )
    # Signed only if it would play: an unknown voice or unspeakable text is refused now.
    await _parse_say(app, body.voice, body.text, body.ext)
    expires = int(time.time()) + min(ttl, settings.signed_url_max_s)
    # The URL is charged to the key that signs it (none without a keys file).
    key = caller().key
    signer = key.name if key is not None else ""
    path = signed_say_path(secret, body.voice, body.text, body.ext, expires, signer)
    answer: SignedUrl = {
        "url": settings.public_url + path,
        "path": path,
        "expires": expires,
        "key": signer or None,
    }
    return web.json_response(answer)


def _secret(request: web.Request) -> str:
    return request.app[keys.SETTINGS].url_signing_secret.get_secret_value()


async def _parse(request: web.Request) -> SayParsed:
    match = request.match_info
    return await _parse_say(request.app, match["voice"], match["text"], match["ext"])


async def _parse_say(app: web.Application, voice: str, text: str, ext: str) -> SayParsed:
    # (Off the event loop where a text front end may take long: a long text full of digits.)
    settings, raw = app[keys.SETTINGS], text.encode("utf-8", "replace")
    words, expansions = app[keys.VOCABULARY], app[keys.EXPANSIONS]
    return await validate_off_loop(
        settings, raw, parse_say, voice, text, ext, settings, words, expansions
    )


async def _play(request: web.Request, parsed: SayParsed) -> web.StreamResponse:
    req, ext = parsed
    return await serve_speech(request, req, present=request.app[keys.PRESENTATIONS].say[ext.name])
