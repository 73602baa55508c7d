"""The OpenAPI document describes every route the server registers, and the saved copy under
docs/ is what a default server serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp import web
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from gateway.errors import VoxgateError
from gateway.http.app import create_app
from gateway.http.openapi import build_openapi
from gateway.http.ops import readiness
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
    assert served["openapi"] == "3.2.0"
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
    assert error == {"$ref": "#/components/schemas/ErrorObject"}
    inner = doc["components"]["schemas"]["ErrorObject"]
    assert inner["required"] == ["message", "type", "param", "code"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "200" in op["responses"], (method, path)


def component_validator(doc: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator for ``#/components/schemas/{name}`` of ``doc`` (its references resolved)."""
    registry: Registry[Any] = Registry().with_resource("urn:doc", DRAFT202012.create_resource(doc))
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry)


def error_classes() -> set[type[VoxgateError]]:
    """VoxgateError and every subclass of it, wherever defined (the app imports them all)."""
    found: set[type[VoxgateError]] = set()
    todo: list[type[VoxgateError]] = [VoxgateError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_type_an_error_class_carries_is_documented(
    settings: Settings, counting_engine: CountingEngine
) -> None:
    create_app(settings, engines={"piper": counting_engine})  # (every module of the app loaded)
    classes = error_classes()
    assert len(classes) > 10  # (the walk found the exception tree, not one class)
    sent = {cls.type for cls in classes}
    doc = build_openapi(settings)
    documented = doc["components"]["schemas"]["ErrorObject"]["properties"]["type"]["enum"]
    assert "rate_limit_exceeded" in sent  # every 429
    assert sent <= set(documented), sent - set(documented)
    assert set(documented) <= sent, set(documented) - sent  # no value nothing sends


async def test_readiness_before_the_service_exists_is_a_documented_body(
    settings: Settings,
) -> None:
    """``starting``: what /readyz answers while the app is still starting (no speech service
    yet). The other states are checked on every /readyz answer the suite's gateways give."""
    status, body = await readiness(web.Application())
    assert (status, body["status"]) == (503, "starting")
    doc = build_openapi(settings)
    problems = [e.message for e in component_validator(doc, "Ready").iter_errors(body)]
    assert problems == []
    answer = doc["paths"]["/readyz"]["get"]["responses"]["503"]["content"]["application/json"]
    assert answer["schema"] == {"$ref": "#/components/schemas/Ready"}
