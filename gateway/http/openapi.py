"""The OpenAPI 3.2 description of the gateway, served at ``/openapi.json``: generated from the
route table (:mod:`gateway.http.routes`), as FastAPI generates its document from its routes.

What each part is generated from, and the tests that hold the document to the server: docs/api.md
(its opening); ``tests/test_openapi.py`` also checks it describes exactly the routes the app
registers. Each route's operation comes from its declaration (:class:`gateway.http.routing.Route`),
and what its access and wrappers add (a key: ``security`` and 401/403/429; a JSON-only body: 415;
a body: 408/413; the Host allow-list: 421) from the same facts the registration reads. This
module adds the prose around it. 3.2, not 3.1, for ``itemSchema``: an event stream is described
event by event. Regenerate the saved copy with ``python -m gateway.http.openapi docs/openapi.json``.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from gateway.api.models import RequestModel
from gateway.http.origins import served_hosts
from gateway.http.requestid import HEADER as REQUEST_ID_HEADER
from gateway.http.requestid import MAX_LENGTH, REQUEST_ID_PATTERN
from gateway.http.routes import route_table
from gateway.http.routing import (
    JSON,
    Answer,
    Binary,
    Events,
    Header,
    Json,
    Media,
    Param,
    Route,
    RouteTable,
    Text,
    wrapper_statuses,
)
from gateway.runtime.settings import Settings
from synth import audio

VERSION = "0.1.0"

TAGS = {
    "speech": "Text to speech.",
    "compatible": "Request shapes of other TTS servers.",
    "telephony": "URLs PBXs play (Asterisk, FreeSWITCH, Twilio) and jambonz.",
    "operations": "Health, readiness, metrics, this document.",
}
SECURITY_SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key's secret (OpenAI clients send their `api_key` so).",
    },
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}
# A route that asks for a key asks for one only when the server has a keys file: hence the empty
# alternative (docs/security.md).
KEYED: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}, {}]
REQUEST_ID = {
    "description": "The request's X-Request-Id when it sent one of at most "
    f"{MAX_LENGTH} characters from A-Z a-z 0-9 . _ : + / = -; else one the gateway made. The "
    "access log names it too.",
    "schema": {"type": "string", "pattern": REQUEST_ID_PATTERN},
}


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _format_table() -> str:
    rows = [
        "| format | Content-Type | encoding | default rate | streams |",
        "|---|---|---|---|---|",
    ]
    for f in audio.FORMATS.values():
        rate = f"{f.default_rate} Hz" if f.default_rate else "the voice's"
        enc = f"{f.container or 'raw'} {f.subtype}"
        rows.append(
            f"| `{f.name}` | `{f.content_type}` | {enc} | {rate} | "
            f"{'yes' if f.streamable else 'no'} |"
        )
    return "\n".join(rows)


def _info() -> dict[str, Any]:
    return {
        "title": "voxgate",
        "version": VERSION,
        "summary": "A cached text-to-speech gateway.",
        "description": "Every audio response is content-addressed: the same text, voice, "
        "model weights, parameters, format and rate always give the same key and bytes.\n\n"
        "Formats:\n\n" + _format_table() + "\n\nErrors use OpenAI's shape "
        '`{"error": {"message", "type", "param", "code"}}`. HEAD is accepted wherever GET is.',
        "license": {"name": "GPL-3.0-or-later", "identifier": "GPL-3.0-or-later"},
    }


@functools.cache
def _schema_text(model: type[RequestModel]) -> str:
    return json.dumps(model.model_json_schema(ref_template="#/components/schemas/{model}"))


def _json_schema(model: type[RequestModel]) -> dict[str, Any]:
    """``model``'s JSON schema, references into the document's components (a fresh copy: pydantic
    takes milliseconds to generate one, and every document build asks for each a few times)."""
    schema: dict[str, Any] = json.loads(_schema_text(model))
    return schema


def _strip_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic titles every property with its own name: noise in a document that names them."""
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def request_schemas(models: Iterable[type[RequestModel]]) -> dict[str, Any]:
    """The JSON schemas of ``models`` (and the models they refer to), by model title."""
    schemas: dict[str, Any] = {}
    for model in models:
        schema = _json_schema(model)
        for name, nested in schema.pop("$defs", {}).items():
            schemas[name] = _strip_titles(nested)
        schemas[schema["title"]] = _strip_titles(schema)
    return schemas


@functools.cache
def _typed_schemas_text(types: tuple[type, ...], unions: tuple[Events, ...]) -> str:
    _, defs = TypeAdapter.json_schemas(
        [(t, "serialization", TypeAdapter(t)) for t in types],
        ref_template="#/components/schemas/{model}",
    )
    schemas = {name: _strip_titles(schema) for name, schema in defs["$defs"].items()}
    for schema in schemas.values():  # docstrings mark code ``so``; the document's Markdown `so`
        if "description" in schema:
            schema["description"] = schema["description"].replace("``", "`")
    for union in unions:
        kinds = {
            t.__name__: schemas[t.__name__]["properties"]["type"]["const"] for t in union.types
        }
        schemas[union.name] = {
            "oneOf": [_ref("schemas", name) for name in kinds],
            "discriminator": {
                "propertyName": "type",
                "mapping": {kind: f"#/components/schemas/{name}" for name, kind in kinds.items()},
            },
        }
    return json.dumps(schemas)


def typed_schemas(answers: Iterable[Answer]) -> dict[str, Any]:
    """The schemas of the types ``answers``' bodies are built as, and of the types they contain,
    by type name; an event stream's union of events by its name."""
    media = [m for a in answers for m in a.content.values()]
    unions = tuple(dict.fromkeys(m for m in media if isinstance(m, Events)))
    types = [m.model for m in media if isinstance(m, Json) and m.model is not None]
    types += [t for u in unions for t in u.types]
    schemas: dict[str, Any] = json.loads(_typed_schemas_text(tuple(dict.fromkeys(types)), unions))
    return schemas


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query value is never JSON null: drop the null branch of an optional field's schema."""
    options = [o for o in schema.get("anyOf", []) if o != {"type": "null"}]
    if len(options) == 1:
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
        if schema.get("default") is not None:
            rest["default"] = schema["default"]
        return {**options[0], **rest}
    return schema


def query_parameters(model: type[RequestModel]) -> list[Any]:
    """The query parameters of ``model``'s fields."""
    schema = _json_schema(model)
    required = set(schema.get("required", []))
    params = []
    for name, prop in schema["properties"].items():
        prop = _without_null({k: v for k, v in prop.items() if k != "title"})
        description = prop.pop("description", "")
        params.append(_param(Param(name, "query", prop, description, name in required)))
    return params


def _param(param: Param) -> dict[str, Any]:
    out: dict[str, Any] = {"name": param.name, "in": param.where, "required": param.required}
    if param.description:
        out["description"] = param.description
    return {**out, "schema": dict(param.schema)}


def _header(header: Header) -> dict[str, Any]:
    out: dict[str, Any] = {"schema": dict(header.schema)}
    if header.description:
        out["description"] = header.description
    return out


def _media(name: str, media: Media) -> dict[str, Any]:
    if isinstance(media, Binary):
        return {"schema": {"type": "string", "contentMediaType": name}}
    if isinstance(media, Text):
        return {"schema": {"type": "string"}}
    if isinstance(media, Json):
        model = media.model
        return {"schema": {"type": "object"} if model is None else _ref("schemas", model.__name__)}
    data = {
        "type": "string",
        "contentMediaType": JSON,
        "contentSchema": _ref("schemas", media.name),
    }
    item = {
        "type": "object",
        "required": ["data"],
        "properties": {"data": data, "event": {"type": "string", "const": "message"}},
    }
    return {"description": media.description, "itemSchema": item}


def _answer(answer: Answer) -> dict[str, Any]:
    """A response object, with the request's X-Request-Id (:mod:`gateway.http.requestid`)."""
    headers = {h.name: _header(h) for h in answer.headers}
    out: dict[str, Any] = {
        "description": answer.description,
        "headers": {**headers, str(REQUEST_ID_HEADER): _ref("headers", "RequestId")},
    }
    if answer.content:
        out["content"] = {name: _media(name, m) for name, m in answer.content.items()}
    return out


def operation(route: Route, table: RouteTable, settings: Settings) -> dict[str, Any]:
    """The operation object of ``route`` on a server running with ``settings``."""
    op: dict[str, Any] = {"tags": [route.tag], "summary": route.summary}
    if route.description:
        op["description"] = route.description
    if route.operation_id:
        op["operationId"] = route.operation_id
    params = [_param(p) for p in route.params]
    if route.query is not None:
        params += query_parameters(route.query)
    params += [
        _ref("parameters", h.component) if h.component else _header(h) for h in route.headers
    ]
    if params:
        op["parameters"] = params
    if route.body is not None:
        schema = _ref("schemas", _json_schema(route.body.model)["title"])
        content = {media: {"schema": schema} for media in route.body.media}
        op["requestBody"] = {"required": True, "content": content}
    if route.keyed:
        op["security"] = KEYED
    responses = {str(status): _answer(a) for status, a in route.answers.items()}
    wrappers = wrapper_statuses(
        route,
        require_json=settings.require_json_content_type,
        host_check=bool(served_hosts(settings.allowed_hosts, settings.host)),
    )
    for status in (*route.common, *wrappers):
        responses.setdefault(str(status), _ref("responses", table.common[status].name))
    op["responses"] = responses
    return op


def build_openapi(settings: Settings, table: RouteTable | None = None) -> dict[str, Any]:
    """The OpenAPI 3.2 document of a server running with ``settings`` and ``table`` (default:
    its route table)."""
    table = route_table(settings) if table is None else table
    paths: dict[str, dict[str, Any]] = {}
    for route in table.routes:
        paths.setdefault(route.path, {})[route.method.lower()] = operation(route, table, settings)
    models = [m for r in table.routes for m in (r.body.model if r.body else None, r.query) if m]
    answers = [a for r in table.routes for a in r.answers.values()]
    answers += [c.answer for c in table.common.values()]
    headers = {h.component: h for r in table.routes for h in r.headers if h.component}
    return {
        "openapi": "3.2.0",
        "info": _info(),
        "tags": [{"name": name, "description": text} for name, text in TAGS.items()],
        "paths": paths,
        "components": {
            "schemas": {**request_schemas(dict.fromkeys(models)), **typed_schemas(answers)},
            "parameters": {
                name: {"name": h.name, "in": "header", **_header(h)} for name, h in headers.items()
            },
            "responses": {c.name: _answer(c.answer) for c in table.common.values()},
            "headers": {"RequestId": REQUEST_ID},
            "securitySchemes": SECURITY_SCHEMES,
        },
    }


def render(settings: Settings, table: RouteTable | None = None) -> str:
    """The document as saved under ``docs/`` (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(build_openapi(settings, table), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    """Write the document for the default settings to ``argv[0]`` (or stdout)."""
    text = render(Settings.load(env={}))
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
