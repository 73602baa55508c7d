"""The HTTP side of the endpoints existing clients call besides OpenAI's: Coqui tts-server's
``/api/tts`` and the plain query-string ``GET /synthesize`` (their parsing: :mod:`gateway.api.compat`).

Query strings carry request text here: the access log writes only the route template, never the
URL, so the text does not reach the logs.
"""

from __future__ import annotations

from aiohttp import web

from gateway.api.compat import COQUI_FIELDS, check_unknown, parse_coqui, parse_synthesize
from gateway.api.parsing import read_json_object
from gateway.http import keys
from gateway.http.delivery import serve_speech


async def coqui_fields(request: web.Request) -> dict[str, str]:
    """The fields of a Coqui ``/api/tts`` request: headers, then query string, then form/JSON."""
    values: dict[str, str] = {k: v for k, v in request.query.items()}
    if request.method == "POST" and request.can_read_body:
        if request.content_type == "application/json":
            body = await read_json_object(request, request.app[keys.MAX_BODY_BYTES])
            values.update({k: v if isinstance(v, str) else str(v) for k, v in body.items()})
        else:
            form = await request.post()
            values.update({k: v for k, v in form.items() if isinstance(v, str)})
    check_unknown(set(values), COQUI_FIELDS, "/api/tts")
    for name, header in COQUI_FIELDS.items():
        if request.headers.get(header):
            values[name] = request.headers[header]
    return values


async def api_tts(request: web.Request) -> web.StreamResponse:
    """``GET|POST /api/tts``: Coqui tts-server compatible; answers WAV."""
    service = request.app[keys.SPEECH]
    values = await coqui_fields(request)
    req = parse_coqui(values, request.app[keys.SETTINGS], service)
    return await serve_speech(request, req)


async def synthesize(request: web.Request) -> web.StreamResponse:
    """``GET /synthesize``: the plain query-string form."""
    service = request.app[keys.SPEECH]
    query = {k: v for k, v in request.query.items()}
    req = parse_synthesize(query, request.app[keys.SETTINGS], service)
    return await serve_speech(request, req)
