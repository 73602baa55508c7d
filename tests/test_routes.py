"""The route table is the one statement of the routes: the app registers exactly its routes, in
its order; the access guards, the JSON-only rule, CORS and the OpenAPI document follow it (a route
removed or changed in the table is removed or changed in all of them); every route answers a
request without a key as its access says, on `voxgate serve` with keys on, public audio URLs on
and off; docs/api.md's endpoint table and the request models' route names are the table's; and
``python -m gateway.http.openapi`` prints what a server serves."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gateway.api.models import RequestModel
from gateway.http.app import create_app
from gateway.http.auth import OPEN
from gateway.http.openapi import TAGS
from gateway.http.routes import AUDIO, route_table
from gateway.http.routing import JSON, Body, Route, RouteTable
from gateway.runtime.apikeys import key_table
from gateway.runtime.settings import Settings
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.served import DefaultServer

# One pytest-xdist worker runs the whole module: its tests share module-scoped `voxgate serve`s.
pytestmark = pytest.mark.xdist_group("routes")

ROOT = Path(__file__).resolve().parents[1]
SPEAK_SECRET = canary("speak")
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


# ---- access, as the table declares it, on `voxgate serve` ------------------------------------

DEFAULT = route_table(Settings.load(env={}))
# The access of each route with keys on (a route may need a key only then: /metrics).
KEYED_ACCESS = {
    (r.method, r.path): r
    for r in route_table(Settings.load(env={"VOXGATE_API_KEYS_FILE": "keys.toml"})).routes
}
KEY = {"X-API-Key": SPEAK_SECRET}


@dataclass
class Keyed:
    """`voxgate serve` with a keys file, public audio URLs on or off, and audio stored under
    ``key`` (with its speech marks)."""

    server: DefaultServer
    public: bool
    key: str

    async def status(self, method: str, path: str) -> int:
        """The status of a request sent without a key."""
        body = {} if method == "POST" else None
        return (await self.server.request(method, path, json=body))[0]


@pytest.fixture(scope="module", params=[True, False], ids=["public-audio-urls", "keys-only"])
def keyed_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Keyed]:
    public: bool = request.param
    home = tmp_path_factory.mktemp("keyed")
    keys_file = home / "keys.toml"
    keys_file.write_text(key_table("ivr", SPEAK_SECRET, ["speak"]), encoding="utf-8")
    flag = "true" if public else "false"
    server = DefaultServer(
        home / "srv", "--api-keys-file", str(keys_file), "--public-audio-urls", flag
    )
    try:
        server.wait_ready()
        body = {**BODY, "response_format": "wav"}
        status, headers, _ = asyncio.run(
            server.request("POST", "/v1/audio/speech", json=body, headers=KEY)
        )
        assert status == 200
        yield Keyed(server, public, headers["X-Audio-Key"])
        # Every answer the module's tests received, against the document the server serves.
        assert asyncio.run(server.conformance_failures()) == []
    finally:
        server.close()


def _filled(path: str, key: str) -> str:
    values = {
        "key": key,
        "ext": "ulaw",
        "voice": "joe",
        "text": "Hi",
        "token": "1~ivr~x",
        "id": "0123456789abcdef",
    }
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


@pytest.mark.parametrize("route", DEFAULT.routes, ids=lambda r: f"{r.method} {r.path}")
async def test_each_route_answers_a_request_without_a_key_as_its_access_says(
    keyed_server: Keyed, route: Route
) -> None:
    """Derived from the table, so a new route is covered: a keyed route answers 401 unless it
    reads an audio address while public audio URLs are on; then it serves the stored audio."""
    route = KEYED_ACCESS[route.method, route.path]
    status = await keyed_server.status(route.method, _filled(route.path, keyed_server.key))
    public = route.access.capability and keyed_server.public
    if public:
        assert status == 200
    elif route.keyed:
        assert status == 401
    else:
        assert status != 401


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "unknown"])
async def test_the_audio_and_what_is_read_under_its_address_answer_alike(
    keyed_server: Keyed, stored: bool
) -> None:
    key = keyed_server.key if stored else "0" * 64
    suffixes = ("", ".ulaw", ".marks", ".vtt", ".srt")
    statuses = [await keyed_server.status("GET", f"/v1/audio/{key}{s}") for s in suffixes]
    alike = (200 if stored else 404) if keyed_server.public else 401
    assert statuses == [alike] * len(suffixes)


def test_the_capabilities_are_exactly_the_reads_of_an_audio_address() -> None:
    capabilities = {r.path for r in DEFAULT.routes if r.access.capability}
    under = {r.path for r in DEFAULT.routes if r.method == "GET" and r.path.startswith(AUDIO)}
    assert capabilities == under
    assert {p.removeprefix(AUDIO) for p in capabilities} == {"", ".{ext}", ".marks", ".vtt", ".srt"}


def test_the_probes_are_open_gets() -> None:
    probes = [r for r in DEFAULT.routes if r.probe]
    assert probes and all(r.method == "GET" and not r.keyed for r in probes)
    assert DEFAULT.probe_paths == {r.path for r in probes}


def test_the_request_models_name_the_routes_that_read_them() -> None:
    """A model's ``route`` (named in its "unsupported field" errors) is a route that reads it."""
    reading: dict[type, set[str]] = {}
    for r in DEFAULT.routes:
        for model in (r.body.model if r.body else None, r.query):
            if model is not None:
                reading.setdefault(model, set()).update({r.path, f"{r.method} {r.path}"})
    for model, names in reading.items():
        assert model.route is None or model.route in names, (model, names)

    def named(cls: type[RequestModel]) -> set[str]:
        own = {cls.__name__} if vars(cls).get("route") is not None else set()
        return own.union(*(named(sub) for sub in cls.__subclasses__()))

    # (Each named model, or a model made from it for the settings, is read by a route.)
    read = {c.__name__ for model in reading for c in model.__mro__}
    assert named(RequestModel) <= read


# ---- docs/api.md's endpoint table ----------------------------------------------------------


def endpoint_table(table: RouteTable) -> str:
    """docs/api.md's endpoint table, rendered from ``table``: by tag, then in table order; the
    methods of one path with the same summary and access in one row."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for route in sorted(table.routes, key=lambda r: list(TAGS).index(r.tag)):
        access = route.access.name
        if route.access.capability:
            access += " (none while `public_audio_urls` is on)"
        rows.setdefault((route.path, route.summary, access), []).append(route.method)
    lines = ["| method | path | what | access |", "|---|---|---|---|"]
    lines += [
        f"| {', '.join(methods)} | `{path}` | {summary} | {access} |"
        for (path, summary, access), methods in rows.items()
    ]
    return "\n".join(lines)


def test_the_api_docs_endpoint_table_is_the_route_tables() -> None:
    lines = (ROOT / "docs" / "api.md").read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| method | path |")))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    expected = endpoint_table(DEFAULT)
    assert "\n".join(lines[start:end]) == expected, (
        "docs/api.md's endpoint table is not the route table's; replace it with:\n" + expected
    )


def test_the_security_access_table_lists_every_route_with_its_access(settings: Settings) -> None:
    """docs/security.md's "Who can reach what" has one row per route the app registers (from its
    router: marks and captions included), each naming the access the route table gives it."""
    app = create_app(settings, engines={})
    registered = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method not in ("HEAD", "*") and route.resource is not None
    }
    # The table says what each route asks for while keys are on.
    keyed = settings.replace(api_keys_file="keys.toml")
    access = {(r.method, r.path): r.access.name for r in route_table(keyed).routes}
    text = (Path(__file__).parent.parent / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("## Who can reach what", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| (GET|POST|PUT|DELETE) \| `([^`]+)` \| ([^|]+) \| ([^|]+) \|$", section, re.M
    )
    documented = {(method, path): (who, why.strip()) for method, path, who, why in rows}
    assert len(documented) == len(rows)  # (each route once)
    assert set(documented) == registered
    for route, (who, why) in documented.items():
        assert re.match(r"`([^`]+)`", who).group(1) == access[route], route  # type: ignore[union-attr]
        assert why, route
