"""The HTTP side of the endpoints existing clients call besides OpenAI's: Coqui tts-server's
``/api/tts``, the plain query-string ``GET /synthesize`` and Piper's HTTP API (``POST /``,
``GET /voices``) (their parsing: :mod:`gateway.api.compat`).

Query strings carry request text here: the access log writes only the route template, never the
URL, so the text does not reach the logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.api.compat import COQUI_HEADERS, parse_coqui, parse_piper, parse_synthesize
from gateway.api.parsing import ExpansionMemo, read_json_object, validate_off_loop
from gateway.errors import BadRequest, RequestTimeout
from gateway.http import keys
from gateway.http.delivery import serve_speech
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.vocabulary import Vocabulary


async def coqui_fields(request: web.Request) -> dict[str, Any]:
    """The fields of a Coqui ``/api/tts`` request: headers, then query string, then form/JSON.

    JSON values are passed on as they are (the model rejects a non-string); an uploaded file in
    a form is passed on as itself too, so it is refused rather than silently dropped.
    """
    values: dict[str, Any] = {k: v for k, v in request.query.items()}
    if request.method == "POST" and request.can_read_body:
        timeout_s = request.app[keys.SETTINGS].body_timeout_s
        if request.content_type == "application/json":
            body = await read_json_object(request, request.app[keys.MAX_BODY_BYTES], timeout_s)
            values.update(body)
        else:
            try:
                async with asyncio.timeout(timeout_s):
                    form = await request.post()
            except TimeoutError:
                raise RequestTimeout(
                    f"the request body did not arrive within {timeout_s:g} s (body_timeout_s)",
                    code="body_timeout",
                ) from None
            except (ValueError, LookupError, HttpProcessingError) as exc:
                # aiohttp's form parsing: a multipart type without a boundary, a part without
                # a name, a value that is not UTF-8 (UnicodeDecodeError is a ValueError), a
                # charset Python does not know (LookupError), a part whose header lines do not
                # parse (InvalidHeader, found by schemathesis).
                raise BadRequest(
                    f"request body is not a valid {request.content_type} form",
                    code="malformed_form",
                ) from exc
            values.update(form.items())
    for name, header in COQUI_HEADERS.items():
        if request.headers.get(header):
            values[name] = request.headers[header]
    return values


Parser = Callable[[Any, Settings, Vocabulary, ExpansionMemo], SpeechRequest]


async def _parse(request: web.Request, parse: Parser, values: Mapping[str, Any]) -> SpeechRequest:
    app = request.app
    settings, words, expansions = app[keys.SETTINGS], app[keys.VOCABULARY], app[keys.EXPANSIONS]
    text = values.get("text")
    raw = text.encode("utf-8", "replace") if isinstance(text, str) else None
    return await validate_off_loop(settings, raw, parse, values, settings, words, expansions)


async def api_tts(request: web.Request) -> web.StreamResponse:
    """``GET|POST /api/tts``: Coqui tts-server compatible; answers WAV."""
    values = await coqui_fields(request)
    req = await _parse(request, parse_coqui, values)
    # A GET is a URL a player may fetch and keep (max-age); a POST's answer is not kept.
    get = request.method in ("GET", "HEAD")
    present = request.app[keys.PRESENTATIONS].synthesis if get else None
    return await serve_speech(request, req, present=present)


async def synthesize(request: web.Request) -> web.StreamResponse:
    """``GET /synthesize``: the plain query-string form."""
    query = {k: v for k, v in request.query.items()}
    req = await _parse(request, parse_synthesize, query)
    return await serve_speech(request, req, present=request.app[keys.PRESENTATIONS].synthesis)


async def piper_speak(request: web.Request) -> web.StreamResponse:
    """``POST /``: Piper's HTTP API (JSON body); answers WAV at the voice's rate."""
    app = request.app
    body = await read_json_object(
        request, app[keys.MAX_BODY_BYTES], app[keys.SETTINGS].body_timeout_s
    )
    req = await _parse(request, parse_piper, body)
    return await serve_speech(request, req)


async def piper_voices(request: web.Request) -> web.Response:
    """``GET /voices``: Piper's voice listing, ``{name: config}``, with the parts of a Piper
    voice config a client reads (rate, language, speakers, inference defaults)."""
    service = request.app[keys.SPEECH]
    out: dict[str, Any] = {}
    for model, handle in service.models.items():
        for voice in handle.engine.voices():
            if voice.name in out:
                continue  # the first model serving a name is the one POST / speaks with
            out[voice.name] = {
                "audio": {"sample_rate": handle.engine.sample_rate},
                "language": {"code": voice.language},
                "num_speakers": 1,
                "speaker_id_map": {},
                "inference": dict(handle.engine.default_params(voice.name)),
                "model": model,
                "description": voice.description,
            }
    return web.json_response(out)
