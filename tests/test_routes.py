"""The route table is the one statement of the routes: the app registers exactly its routes, in
its order; the access guards, the JSON-only rule, CORS and the OpenAPI document follow it (a route
removed or changed in the table is removed or changed in all of them); and
``python -m gateway.http.openapi`` prints what a server serves."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.http.app import create_app
from gateway.http.auth import OPEN
from gateway.http.routes import route_table
from gateway.http.routing import JSON, Body, RouteTable
from gateway.runtime.apikeys import key_table
from gateway.runtime.settings import Settings
from tests.conftest import GatewayFactory

ROOT = Path(__file__).resolve().parents[1]
SPEAK_SECRET = "speak-secret-0123456789-abcdefghijklmnop"
BODY = {"model": "piper", "voice": "joe", "input": "Press one."}
ORIGIN = "https://app.example"


def keyed(settings: Settings, tmp_path: Path) -> Settings:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(key_table("ivr", SPEAK_SECRET, ["speak"]), encoding="utf-8")
    return settings.replace(api_keys_file=str(keys_file))


def changed(table: RouteTable, method: str, path: str, **fields: Any) -> RouteTable:
    """``table`` with the route ``method path`` changed by ``fields``."""
    routes = tuple(
        replace(r, **fields) if (r.method, r.path) == (method, path) else r for r in table.routes
    )
    assert routes != table.routes
    return RouteTable(routes, table.common)


def test_the_app_registers_exactly_the_table_in_its_order(settings: Settings) -> None:
    for variant in (settings, settings.replace(metrics_auth=True, allowed_hosts=("a.example",))):
        app = create_app(variant, engines={})
        table = route_table(variant)
        registered = [
            (route.method, route.resource.canonical, route.handler.__name__)
            for route in app.router.routes()
            # (aiohttp's HEAD beside each GET; the 405/404 fallbacks)
            if route.method not in ("HEAD", "*") and route.resource is not None
        ]
        declared = [(r.method, r.path, r.handler.__name__) for r in table.routes]
        assert registered == declared
        assert len(set(declared)) == len(declared)  # (each route declared once)


async def test_a_route_removed_from_the_table_is_gone_from_the_guards_and_the_document(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    settings = keyed(settings, tmp_path)
    key = {"X-API-Key": SPEAK_SECRET}
    full = await gateway(settings=settings)
    # In the table: guarded (401 without a key; 415 for a body not sent as JSON) and described.
    assert (await full.post("/v1/ssml/explain", json=BODY)).status == 401
    plain = {**key, "Content-Type": "text/plain"}
    assert (await full.post("/v1/ssml/explain", data=json.dumps(BODY), headers=plain)).status == 415
    assert (await full.post("/v1/ssml/explain", json=BODY, headers=key)).status == 200
    described = await (await full.get("/openapi.json")).json()
    assert set(described["paths"]["/v1/ssml/explain"]["post"]["responses"]) >= {"401", "415"}

    less = await gateway(
        settings=settings, routes=route_table(settings).without("POST", "/v1/ssml/explain")
    )
    # Out of the table: no guard answers for it, with a key or without; only the 404 fallback.
    for headers in ({}, key, plain):
        answer = await less.post("/v1/ssml/explain", json=BODY, headers=headers)
        assert answer.status == 404, headers
    described = await (await less.get("/openapi.json")).json()
    assert "/v1/ssml/explain" not in described["paths"]
    # The route beside it, whose body is the same, is untouched.
    assert (await less.post("/v1/audio/speech", json=BODY)).status == 401
    assert "/v1/audio/speech" in described["paths"]


async def test_access_and_the_json_rule_of_a_route_are_what_the_table_says(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    settings = keyed(settings, tmp_path)
    table = route_table(settings)
    table = changed(table, "GET", "/v1/voices", access=OPEN)
    explain = next(r for r in table.routes if r.path == "/v1/ssml/explain")
    assert explain.body is not None
    table = changed(
        table, "POST", "/v1/ssml/explain", body=Body(explain.body.model, (JSON, "text/plain"))
    )
    http = await gateway(settings=settings, routes=table)
    # /v1/voices open: answered without a key, and described without security or 401.
    assert (await http.get("/v1/voices")).status == 200
    # The explain body also taken as text/plain: the 415 guard is gone, the key check is not.
    plain = {"X-API-Key": SPEAK_SECRET, "Content-Type": "text/plain"}
    assert (await http.post("/v1/ssml/explain", data=json.dumps(BODY), headers=plain)).status == 200
    assert (await http.post("/v1/ssml/explain", json=BODY)).status == 401
    doc = await (await http.get("/openapi.json")).json()
    voices = doc["paths"]["/v1/voices"]["get"]
    assert "security" not in voices and "401" not in voices["responses"]
    op = doc["paths"]["/v1/ssml/explain"]["post"]
    assert "415" not in op["responses"] and "401" in op["responses"]
    assert set(op["requestBody"]["content"]) == {JSON, "text/plain"}
    # (And the default table's document says what the default app does.)
    default = await (await (await gateway(settings=settings)).get("/openapi.json")).json()
    assert "security" in default["paths"]["/v1/voices"]["get"]
    assert "415" in default["paths"]["/v1/ssml/explain"]["post"]["responses"]


async def test_python_m_openapi_prints_the_served_document(gateway: GatewayFactory) -> None:
    served = await (await (await gateway()).get("/openapi.json")).read()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.http.openapi",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    printed, errors = await proc.communicate()
    assert proc.returncode == 0, errors.decode()[-2000:]
    assert printed == served


def _answers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    ops = [op for item in doc["paths"].values() for op in item.values()]
    answers = [a for op in ops for a in op["responses"].values() if "$ref" not in a]
    return answers + list(doc["components"]["responses"].values())


async def test_cors_allows_every_header_the_document_reads_and_exposes_every_one_it_answers(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    http = await gateway(settings=keyed(settings, tmp_path).replace(cors_origins=(ORIGIN,)))
    doc = await (await http.get("/openapi.json")).json()
    read = {p["name"] for p in doc["components"]["parameters"].values() if p["in"] == "header"}
    answered = {name for answer in _answers(doc) for name in answer.get("headers", {})}
    preflight = await http.options(
        "/v1/audio/" + "0" * 64,
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status == 204
    allowed = set(preflight.headers["Access-Control-Allow-Headers"].split(", "))
    assert read | {"Authorization", "X-API-Key", "Content-Type", "X-Request-Id"} <= allowed
    answer = await http.get("/healthz", headers={"Origin": ORIGIN})
    exposed = set(answer.headers["Access-Control-Expose-Headers"].split(", "))
    # (Pages read the CORS-safelisted response headers unasked; Connection is hop-by-hop.)
    unasked = {"Cache-Control", "Last-Modified", "Connection"}
    assert answered - unasked <= exposed


def test_the_security_docs_name_the_json_only_routes_of_the_table() -> None:
    row = next(
        line
        for line in (ROOT / "docs" / "security.md").read_text().splitlines()
        if line.startswith("| `require_json_content_type`")
    )
    listed = row.partition("The JSON routes (")[2].partition(") need")[0].partition(":")[2]
    named = {
        ("POST", token.removeprefix("POST "))
        for token in re.findall(r"`((?:POST )?/[^`]*)`", listed)
    }
    table = route_table(Settings.load(env={}))
    assert named == {(r.method, r.path) for r in table.routes if r.json_only}
