"""The conformance check every ``gateway`` fixture runs (tests/conformance.py) finds what departs
from the document: an undocumented status or Content-Type, a JSON body or an event that does
not match its schema, a header outside its enum; and passes what conforms."""

from __future__ import annotations

import copy
import json
from typing import Any

from gateway.http import keys
from gateway.http.openapi import build_openapi
from tests.conformance import Document, RecordingClient, check, sse_events
from tests.conftest import GatewayFactory

SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Hello there. Bye now."}


async def departures(client: RecordingClient, doc: dict[str, Any]) -> list[str]:
    app = client.app
    assert app is not None
    document = Document(doc)
    return [f for rec in client.recorded for f in await check(document, app, rec)]


async def test_conforming_answers_pass_and_each_kind_of_departure_is_named(
    gateway: GatewayFactory,
) -> None:
    client = await gateway()
    assert isinstance(client, RecordingClient)
    sse = await client.post("/v1/audio/speech", json={**SPEECH, "stream_format": "sse"})
    events = list(sse_events(await sse.read()))
    assert [json.loads(e["data"])["type"] for e in events][-1] == "speech.audio.done"
    bad = await client.post("/v1/audio/speech", json={**SPEECH, "speed": 9})
    assert bad.status == 400
    wav = await client.post("/v1/audio/speech", json={**SPEECH, "response_format": "wav"})
    assert wav.headers["X-Cache"] == "HIT"  # (the SSE request stored it)
    await wav.read()
    served = await (await client.get("/openapi.json")).json()
    app = client.app
    assert app is not None
    assert served == build_openapi(app[keys.SETTINGS])
    assert await departures(client, served) == []

    speech = "/v1/audio/speech"
    # An event that does not match its schema (here: a field the delta event now requires).
    doc = copy.deepcopy(served)
    doc["components"]["schemas"]["SpeechAudioDeltaEvent"]["required"].append("sequence")
    found = await departures(client, doc)
    deltas = len(events) - 1
    assert len(found) == deltas and found[0].startswith(f"POST {speech} -> 200: event 0's data")
    assert all(f.endswith("'sequence' is a required property") for f in found), found[0]
    # A JSON body that does not match (an error type the document does not list).
    doc = copy.deepcopy(served)
    doc["components"]["schemas"]["ErrorObject"]["properties"]["type"]["enum"].remove(
        "invalid_request_error"
    )
    assert await departures(client, doc) == [
        f"POST {speech} -> 400: the body does not match "
        "/components/responses/BadRequest/content/application~1json/schema: "
        "at error/type: 'invalid_request_error' is not one of ['permission_error', "
        "'not_found_error', 'rate_limit_exceeded', 'server_overloaded', 'server_error']"
    ]
    # A header outside its enum.
    doc = copy.deepcopy(served)
    doc["paths"][speech]["post"]["responses"]["200"]["headers"]["X-Cache"]["schema"]["enum"] = [
        "MISS"
    ]
    found = await departures(client, doc)
    assert len(found) == 1 and found[0].startswith(f"POST {speech} -> 200: header X-Cache")
    # An undocumented status, and an undocumented Content-Type.
    doc = copy.deepcopy(served)
    del doc["paths"][speech]["post"]["responses"]["400"]
    found = await departures(client, doc)
    assert len(found) == 1
    assert found[0].startswith(f"POST {speech} -> 400: status 400 is not documented")
    doc = copy.deepcopy(served)
    del doc["paths"][speech]["post"]["responses"]["200"]["content"]["audio/wav"]
    found = await departures(client, doc)
    assert len(found) == 1 and "Content-Type audio/wav is not documented" in found[0]


async def test_a_stream_read_in_pieces_is_checked_whole(gateway: GatewayFactory) -> None:
    """The body copy is made as bytes arrive, whichever way the test reads them."""
    client = await gateway()
    assert isinstance(client, RecordingClient)
    r = await client.post("/v1/audio/speech", json={**SPEECH, "stream_format": "sse"})
    got = bytearray()
    async for chunk in r.content.iter_chunked(7):
        got += chunk
    (rec,) = [rec for rec in client.recorded if rec.url.path == "/v1/audio/speech"]
    assert rec.complete() and rec.data() == bytes(got)
    assert len(list(sse_events(bytes(got)))) >= 3
