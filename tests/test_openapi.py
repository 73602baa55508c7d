"""The OpenAPI document describes every route the server registers, and the saved copy under
docs/ is what a default server serves."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from synth import audio
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

SAVED = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"


def registered_routes(settings: Settings, engine: CountingEngine) -> set[tuple[str, str]]:
    app = create_app(settings, engines={"piper": engine})
    routes = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue  # aiohttp adds HEAD beside every GET; the document says HEAD is accepted
        if route.method == "*":
            continue  # the fallbacks that answer other methods 405 and unknown paths 404
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert path, route
        routes.add((route.method.lower(), path))
    return routes


async def test_every_route_is_described_and_the_saved_copy_matches(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    r = await client.get("/openapi.json")
    assert r.status == 200
    served = await r.json()
    assert served["openapi"].startswith("3.1")
    described = {(method, path) for path, ops in served["paths"].items() for method in ops}
    routes = registered_routes(settings, counting_engine)
    assert routes <= described, routes - described
    assert described <= routes, described - routes  # nothing described that is not served
    saved = json.loads(SAVED.read_text())
    assert saved == served, (
        "docs/openapi.json is stale: python -m gateway.http.openapi docs/openapi.json"
    )


def test_document_lists_every_format_and_the_error_shape() -> None:
    doc = json.loads(SAVED.read_text())
    body = doc["components"]["schemas"]["SpeechRequest"]["properties"]
    # response_format is optional (null takes the default): the enum is on its string branch.
    fmt = body["response_format"]
    enums = [o["enum"] for o in [fmt, *fmt.get("anyOf", [])] if "enum" in o]
    assert enums == [list(audio.FORMATS)]
    for name in audio.FORMATS:
        assert f"`{name}`" in doc["info"]["description"]
    error = doc["components"]["schemas"]["Error"]["properties"]["error"]
    assert error["required"] == ["message", "type", "param", "code"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "200" in op["responses"], (method, path)
