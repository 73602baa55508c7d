"""Every request schema of the served OpenAPI document is what the server enforces.

Driven by the document itself: for each operation's JSON body and query parameters, one valid
example (from the schema's examples and defaults), then each property's boundary values (minimum,
maximum and just outside; minLength/maxLength and just outside; a string failing the pattern;
each enum value and one outside; a wrong type; null; the property left out; an unknown property).
Whether the document allows a candidate is decided by a JSON Schema validator over the document,
and the server must agree: 2xx when allowed, 400 when not. A property added to a model is covered
without touching this file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from gateway.runtime.settings import Settings
from tests.conftest import GatewayFactory

# Small bounds keep the valid boundary texts short to synthesize; the document states them.
# (A signing secret: POST /v1/say/sign answers 403 without one.)
LIMITS = {"max_input_chars": 12, "max_catalogue_prompts": 2, "url_signing_secret": "s"}
DOC_URI = "urn:voxgate:openapi"
UNSET = object()


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with a local ``$ref`` followed."""
    while "$ref" in schema:
        node: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def branches(doc: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of ``schema`` (itself when it has none)."""
    schema = resolve(doc, schema)
    options = schema.get("anyOf") or schema.get("oneOf") or [schema]
    return [resolve(doc, o) for o in options if o.get("type") != "null"]


def example(doc: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A value the document offers as valid for ``schema``."""
    schema = resolve(doc, schema)
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("default") is not None:
        return schema["default"]
    first = branches(doc, schema)[0]
    if first is not schema:
        return example(doc, first)
    if "enum" in schema:
        return schema["enum"][0]
    if schema.get("type") == "object":
        props = schema.get("properties", {})
        return {name: example(doc, props[name]) for name in schema.get("required", [])}
    if schema.get("type") == "array":
        return [example(doc, schema["items"])] * max(1, schema.get("minItems", 0))
    if "minimum" in schema:
        return schema["minimum"]
    return {"string": "a", "boolean": True, "integer": 1, "number": 1.0}[
        schema.get("type", "string")
    ]


def boundaries(doc: dict[str, Any], schema: dict[str, Any], *, in_json: bool) -> Iterator[Any]:
    """Boundary candidates for one value of ``schema`` (valid or not: the validator decides)."""
    for b in branches(doc, schema):
        kind = b.get("type")
        yield from b.get("enum", [])
        if "enum" in b:
            yield f"no-such-{b['enum'][0]}"
        if kind in ("integer", "number"):
            step = 1 if kind == "integer" else 0.01
            for bound in ("minimum", "maximum"):
                if bound in b:
                    yield b[bound]
                    yield round(b[bound] + (step if bound == "maximum" else -step), 6)
            yield "x"
        if kind == "string":
            low, high = b.get("minLength"), b.get("maxLength")
            for n in {low, high}:
                if n is not None:
                    yield "a" * n
            if low:
                yield "a" * (low - 1)
            if high is not None:
                yield "a" * (high + 1)
            if "pattern" in b:
                yield next(c for c in (" ", "x") if not re.search(b["pattern"], c))
            if in_json:
                yield 5  # (in a query string every value is a string)
        if kind == "boolean":
            yield from (True, False, "yes")
        if kind == "array":
            item = example(doc, b["items"])
            for n in {b.get("minItems"), b.get("maxItems")}:
                if n is not None:
                    yield [item] * n
                    yield [item] * (n + 1 if n == b.get("maxItems") else max(0, n - 1))
            for option in branches(doc, b["items"]):
                for candidate in boundaries(doc, option, in_json=in_json):
                    yield [candidate]
        if kind == "object":
            base = example(doc, b)
            for name, prop in b.get("properties", {}).items():
                for candidate in boundaries(doc, prop, in_json=in_json):
                    yield {**base, name: candidate}
            yield "x"
    if in_json:
        yield None


def object_cases(
    doc: dict[str, Any], schema: dict[str, Any], *, in_json: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(label, value)``: the example object, then one property changed (or left out) at a time."""
    schema = resolve(doc, schema)
    base = example(doc, schema)
    props = schema.get("properties", {})
    yield "example", base
    for name, prop in props.items():
        for candidate in boundaries(doc, prop, in_json=in_json):
            yield f"{name}={candidate!r:.40}", {**base, name: candidate}
    for name in schema.get("required", []):
        yield f"without {name}", {k: v for k, v in base.items() if k != name}
    if in_json and schema.get("additionalProperties") is False:
        yield "unknown property", {**base, "no_such_field": 1}


def documented(doc: dict[str, Any], schema: dict[str, Any], value: Any) -> bool:
    """Whether the document allows ``value`` for ``schema`` (refs resolved inside it)."""
    wrapped = {"$ref": f"{DOC_URI}#/x", "$schema": "https://json-schema.org/draft/2020-12/schema"}
    registry: Registry[Any] = Registry().with_resource(
        DOC_URI, Resource({**doc, "x": schema}, DRAFT202012)
    )
    return jsonschema.Draft202012Validator(wrapped, registry=registry).is_valid(value)


def query_schema(params: list[dict[str, Any]]) -> dict[str, Any]:
    """The query parameters of an operation as one object schema."""
    query = [p for p in params if p.get("in") == "query"]
    return {
        "type": "object",
        "properties": {p["name"]: p["schema"] for p in query},
        "required": [p["name"] for p in query if p.get("required")],
    }


def as_query(values: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in values.items()}


@pytest.fixture
def small_settings(settings: Settings) -> Settings:
    return settings.replace(**LIMITS)


async def test_every_request_schema_is_enforced_as_documented(
    gateway: GatewayFactory, small_settings: Settings
) -> None:
    client = await gateway(settings=small_settings)
    doc = await (await client.get("/openapi.json")).json()
    checked: dict[str, int] = {}
    kinds: dict[str, set[bool]] = {}
    mismatches: list[str] = []
    for path, ops in doc["paths"].items():
        if "{" in path:
            continue  # path parameters: not a request schema (tested in test_bad_input)
        for method, op in ops.items():
            where = f"{method.upper()} {path}"
            if "101" in op["responses"]:
                continue  # a WebSocket upgrade (its query: test_telephony_jambonz)
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            query = query_schema(op.get("parameters", []))
            if body is not None:
                schema = body["schema"]
                cases = [
                    (label, value, True) for label, value in object_cases(doc, schema, in_json=True)
                ]
            elif query["properties"]:
                schema = query
                cases = [
                    (label, value, False)
                    for label, value in object_cases(doc, schema, in_json=False)
                ]
            else:
                continue
            for label, value, in_json in cases:
                allowed = documented(doc, schema, value)
                if in_json:
                    r = await client.request(method, path, json=value)
                else:
                    r = await client.request(method, path, params=as_query(value))
                await r.read()
                ok = (200 <= r.status < 300) if allowed else r.status == 400
                if not ok:
                    mismatches.append(
                        f"{where} {label}: documented {'valid' if allowed else 'invalid'}, got {r.status}"
                    )
                checked[where] = checked.get(where, 0) + 1
                kinds.setdefault(where, set()).add(allowed)
    # Every operation that takes input was exercised, with more than its example.
    assert set(checked) == {
        "POST /v1/audio/speech",
        "POST /v1/audio/speech/with-timestamps",
        "POST /v1/ssml/explain",
        "GET /api/tts",
        "POST /api/tts",
        "GET /synthesize",
        "POST /v1/prompts",
        "POST /",
        "POST /v1/jambonz/tts",
        "POST /v1/say/sign",
    }, checked
    assert all(n > 5 for n in checked.values()), checked
    # ... and each saw both what the document allows and what it does not.
    assert all(k == {True, False} for k in kinds.values()), kinds
    assert mismatches == []


async def test_coqui_text_must_be_a_string(gateway: GatewayFactory) -> None:
    client = await gateway()
    for text in (None, 42, ["a"]):
        r = await client.post("/api/tts", json={"text": text})
        assert r.status == 400, text
        err = (await r.json())["error"]
        assert err["param"] == "text"
        assert "must be a string" in err["message"]


SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Hi."}
# (label, path, body, whether the document allows it): rules that span fields, JSON's one
# number type, and text with a control character (tab, line feed and carriage return are text).
RULES = [
    ("integral float rate", "/v1/audio/speech", {**SPEECH, "sample_rate": 16000.0}, True),
    ("fractional rate", "/v1/audio/speech", {**SPEECH, "sample_rate": 16000.5}, False),
    ("control character", "/v1/audio/speech", {**SPEECH, "input": "Hi\x01."}, False),
    ("C1 control character", "/v1/audio/speech", {**SPEECH, "input": "Hi\x85."}, False),
    ("tab", "/v1/audio/speech", {**SPEECH, "input": "Hi\t."}, True),
    (
        "sse of flac",
        "/v1/audio/speech",
        {**SPEECH, "stream_format": "sse", "response_format": "flac"},
        False,
    ),
    (
        "sse, stream false",
        "/v1/audio/speech",
        {**SPEECH, "stream_format": "audio", "stream": False},
        False,
    ),
    (
        "stream of wav",
        "/v1/audio/speech",
        {**SPEECH, "stream": True, "response_format": "wav"},
        True,
    ),
    ("sse of the default", "/v1/audio/speech", {**SPEECH, "stream_format": "sse"}, True),
    ("prompt without text", "/v1/prompts", {"prompts": [{}]}, False),
    ("text from defaults", "/v1/prompts", {"prompts": [{}], "defaults": {"input": "Hi."}}, True),
    ("id in defaults", "/v1/prompts", {"prompts": ["Hi."], "defaults": {"id": "x"}}, False),
    ("null id in defaults", "/v1/prompts", {"prompts": ["Hi."], "defaults": {"id": None}}, True),
    ("speaker 0.0", "/", {"text": "Hi.", "speaker_id": 0.0}, True),
    ("speaker 1", "/", {"text": "Hi.", "speaker_id": 1}, False),
    ("no speaker name", "/", {"text": "Hi.", "speaker": ""}, True),
    ("a speaker name", "/", {"text": "Hi.", "speaker": "alice"}, False),
    ("control in Coqui text", "/api/tts", {"text": "Hi\x1b."}, False),
]


async def test_rules_across_fields_are_documented_and_enforced(
    gateway: GatewayFactory, small_settings: Settings
) -> None:
    client = await gateway(settings=small_settings)
    doc = await (await client.get("/openapi.json")).json()
    wrong = []
    for label, path, body, allowed in RULES:
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        r = await client.post(path, json=body)
        await r.read()
        said = documented(doc, schema, body)
        if said != allowed or (200 <= r.status < 300) != allowed or r.status >= 500:
            wrong.append(f"{label}: documented {said}, answered {r.status}, expected {allowed}")
    assert wrong == []
