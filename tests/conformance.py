"""Every answer the suite's gateways give, checked against the OpenAPI document they serve.

:class:`RecordingClient` is the aiohttp ``TestClient`` the ``gateway`` fixture hands out: it keeps
each response (and a copy of its body bytes as they arrive, however the test reads them), and
:meth:`RecordingClient.conformance_failures` checks them once the test is done:

- the route and method are an operation of the document, and the status one of its responses;
- the Content-Type is one the response documents (a body where none is documented is a failure);
- a JSON body validates against the response's schema; a ``text/event-stream`` body is parsed
  into events, each validated against the media type's ``itemSchema`` and its ``data`` (JSON)
  against the ``contentSchema`` there;
- each documented header that was sent validates against its schema (X-Cache's enum, a key's
  pattern, integers).

A response the test cut short (a stream it stopped reading, a connection the server dropped) has
its status, Content-Type, headers and every complete event checked, not a truncated JSON body.

The document is built in-process with :func:`gateway.http.openapi.build_openapi` from the app's
settings and route table (what ``GET /openapi.json`` serves), and validators are compiled once per document and
schema, so the checks cost about a millisecond per test.

The recording is a :class:`Recorder`: an aiohttp trace config, so any ``ClientSession`` can carry
one; for a gateway in another process, check against the :class:`Document` it serves at
``/openapi.json``, routed by ``create_app(settings, engines={})``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from aiohttp import ClientResponse, ClientSession, TraceConfig, TraceRequestEndParams, web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from yarl import URL

from gateway.http import keys
from gateway.http.openapi import build_openapi
from gateway.http.routes import route_table

DOCUMENT_URI = "urn:voxgate:openapi"
JSON = "application/json"
EVENT_STREAM = "text/event-stream"


def media_type(value: str | None) -> str | None:
    """The bare, lower-case media type of a Content-Type (its parameters dropped)."""
    if not value:
        return None
    return value.split(";", 1)[0].strip().lower()


def _normalized(value: str) -> str:
    """A Content-Type with its parameters, spaces dropped and lower-cased, for exact matching."""
    return ";".join(part.strip().lower() for part in value.split(";") if part.strip())


def _escape(token: str) -> str:
    """A JSON pointer token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


class Document:
    """One OpenAPI document with its validators compiled on first use."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        resource = DRAFT202012.create_resource(doc)
        self.registry: Registry[Any] = Registry().with_resource(DOCUMENT_URI, resource)
        self._validators: dict[str, Draft202012Validator] = {}

    def validator(self, pointer: str) -> Draft202012Validator:
        """A validator for the schema at ``pointer`` (its ``$ref`` resolve in the document)."""
        found = self._validators.get(pointer)
        if found is None:
            found = Draft202012Validator(
                {"$ref": f"{DOCUMENT_URI}#{pointer}"},
                registry=self.registry,
                format_checker=Draft202012Validator.FORMAT_CHECKER,
            )
            self._validators[pointer] = found
        return found

    def resolve(self, obj: dict[str, Any], pointer: str) -> tuple[dict[str, Any], str]:
        """``obj`` (at ``pointer``), or what its ``$ref`` names, with its pointer."""
        while "$ref" in obj:
            ref = obj["$ref"]
            assert ref.startswith("#/"), ref
            pointer = ref[1:]
            obj = self.doc
            for token in pointer[1:].split("/"):
                obj = obj[token.replace("~1", "/").replace("~0", "~")]
        return obj, pointer

    def operation(self, path: str, method: str) -> tuple[dict[str, Any], str] | None:
        """The operation object of ``method path`` and its pointer, or None."""
        item = self.doc["paths"].get(path)
        if item is None or method not in item:
            return None
        return item[method], f"/paths/{_escape(path)}/{method}"

    def response(self, op: tuple[dict[str, Any], str], status: int) -> tuple[dict[str, Any], str]:
        """The response object documented for ``status`` (exact, ``4XX`` range or ``default``)."""
        responses = op[0]["responses"]
        for key in (str(status), f"{status // 100}XX", "default"):
            if key in responses:
                return self.resolve(responses[key], f"{op[1]}/responses/{_escape(key)}")
        raise LookupError(f"status {status} is not documented (documented: {sorted(responses)})")

    def media(
        self, response: tuple[dict[str, Any], str], content_type: str
    ) -> tuple[dict[str, Any], str] | None:
        """The media type object of ``response`` for ``content_type`` (with its parameters
        exactly, else by bare type), or None."""
        content = response[0].get("content", {})
        exact = {_normalized(name): name for name in content}
        name = exact.get(_normalized(content_type))
        if name is None:
            bare = {media_type(name): name for name in content if ";" not in name}
            name = bare.get(media_type(content_type))
        if name is None:
            return None
        return content[name], f"{response[1]}/content/{_escape(name)}"


# Documents (with their compiled validators) by the settings they were built for; the most
# recently used few are kept.
_DOCUMENTS: dict[str, Document] = {}
_KEPT_DOCUMENTS = 16


def document_for(app: web.Application) -> Document:
    """The document ``app`` serves, built once per distinct settings (where the cache lives, a
    directory per test, is not in the document), or, for an app given a route table of a test's
    own, from that table."""
    settings = app[keys.SETTINGS]
    table = app[keys.ROUTES]
    if table != route_table(settings):
        return Document(build_openapi(settings, table))
    key = settings.model_dump_json(exclude={"cache_dir"})
    found = _DOCUMENTS.pop(key, None)
    if found is None:
        found = Document(build_openapi(settings))
        while len(_DOCUMENTS) >= _KEPT_DOCUMENTS:
            del _DOCUMENTS[next(iter(_DOCUMENTS))]
    _DOCUMENTS[key] = found  # (last: the most recently used)
    return found


class _TeeStreamReader(StreamReader):
    """A response's body reader that also keeps every byte fed to it (see :func:`tee`)."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        _TEED[id(self)].append(bytes(data))
        return super().feed_data(data, size)


# Bytes received per teed reader (by id: the reader has __slots__ and no weak references), kept
# while the RecordingClient that teed it holds the response.
_TEED: dict[int, list[bytes]] = {}


def tee(stream: StreamReader) -> list[bytes] | None:
    """Keep a copy of what ``stream`` receives from now on, and what it holds unread already
    (nothing has been read of a body when its response is returned). None for an empty body's
    reader (a HEAD, 204 or 304 answer has no StreamReader)."""
    if type(stream) is not StreamReader:
        return None
    received = [bytes(chunk) for chunk in stream._buffer]
    _TEED[id(stream)] = received
    stream.__class__ = _TeeStreamReader
    return received


@dataclass
class Recorded:
    """One response a test received: what was asked and what came back."""

    method: str
    url: URL
    response: ClientResponse
    body: list[bytes] | None = field(default=None)

    def data(self) -> bytes:
        return b"".join(self.body or ())

    def complete(self) -> bool:
        """Whether the whole body arrived (the reader saw its end, without an error)."""
        content = self.response.content
        return self.body is None or (content.is_eof() and content.exception() is None)


def sse_events(data: bytes) -> Iterator[dict[str, Any]]:
    """The events of a ``text/event-stream`` body as the HTML standard parses them: fields
    ``data`` (lines joined by newlines), ``event``, ``id``, ``retry``; comments skipped; an
    event without data is not dispatched; a last event without its blank line is dropped."""
    text = data.decode("utf-8").removeprefix("\ufeff")
    fields: dict[str, Any] = {}
    lines: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if lines:
                yield {**fields, "data": "\n".join(lines)}
            fields, lines = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            lines.append(value)
        elif name in ("event", "id"):
            fields[name] = value
        elif name == "retry" and value.isdigit():
            fields[name] = int(value)


def _first_error(validator: Draft202012Validator, instance: Any) -> str | None:
    """The most relevant error, located: inside a ``oneOf`` or ``anyOf`` whose branches are told
    apart by a constant (a discriminator such as an event's ``type``), the error of the branch
    whose constant the instance has, not "valid under none of the given schemas"."""
    error = best_match(validator.iter_errors(instance))
    if error is None:
        return None
    while error.context:
        branches: dict[Any, list[ValidationError]] = {}
        for inner in error.context:
            branches.setdefault(inner.relative_schema_path[0], []).append(inner)
        fitting = [errs for errs in branches.values() if all(e.validator != "const" for e in errs)]
        if len(fitting) != 1:
            break
        found = best_match(fitting[0])
        assert found is not None
        error = found
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"at {where}: {error.message[:300]}"


def _schema_failure(document: Document, pointer: str, instance: Any, what: str) -> str | None:
    problem = _first_error(document.validator(pointer), instance)
    return None if problem is None else f"{what} does not match {pointer}: {problem}"


@dataclass(frozen=True)
class _Asked:
    """What aiohttp's router reads of a request: its method and path (a mocked request, with
    its mocks, took half the time of checking a test's answers)."""

    method: str
    rel_url: URL


async def route_path(app: web.Application, method: str, raw_path: str) -> str | None:
    """The document path (the resource's template) aiohttp routes ``method raw_path`` to in
    ``app``, or None where only a fallback answers (an unknown path, an unknown method)."""
    asked = cast(web.Request, _Asked(method, URL(raw_path)))
    match = await app.router.resolve(asked)
    if match.http_exception is not None or match.route.method == "*":
        return None
    resource = match.route.resource
    info = resource.get_info() if resource is not None else {}
    path = info.get("path") or info.get("formatter")
    return str(path) if path else None


async def check(document: Document, app: web.Application, rec: Recorded) -> list[str]:
    """What ``rec`` does not conform to in ``document`` (empty: it conforms)."""
    resp = rec.response
    path = await route_path(app, rec.method, rec.url.raw_path)
    if path is None:
        return []  # not an operation: aiohttp's 404/405 fallbacks (tests/test_hostile.py)
    # HEAD is described by its GET (the document says HEAD is accepted wherever GET is).
    method = "get" if rec.method == "HEAD" else rec.method.lower()
    where = f"{rec.method} {path} -> {resp.status}"
    op = document.operation(path, method)
    if op is None:
        return [f"{where}: {method.upper()} {path} is not in the document"]
    try:
        response = document.response(op, resp.status)
    except LookupError as exc:
        return [f"{where}: {exc}"]
    failures = [f"{where}: {problem}" for problem in _headers(document, response, resp)]
    data = rec.data()
    content_type = resp.headers.get("Content-Type")
    if rec.method == "HEAD" or resp.status in (101, 204, 304) or (not data and rec.complete()):
        if data:
            failures.append(f"{where}: a body where HTTP allows none")
        return failures
    documented = sorted(response[0].get("content", {}))
    if content_type is None:
        return [*failures, f"{where}: a body without Content-Type (documented: {documented})"]
    media = document.media(response, content_type)
    if media is None:
        return [*failures, f"{where}: Content-Type {content_type} is not documented ({documented})"]
    bare = media_type(content_type)
    if bare == EVENT_STREAM:
        failures += [f"{where}: {p}" for p in _events(document, media, data, rec.complete())]
    elif (bare == JSON or (bare or "").endswith("+json")) and rec.complete():
        failures += [f"{where}: {p}" for p in _json(document, media, data)]
    return failures


def _headers(
    document: Document, response: tuple[dict[str, Any], str], resp: ClientResponse
) -> Iterator[str]:
    """Documented headers that were sent and do not match their schema (a header's value is a
    string; an integer or number schema is checked against the number it spells)."""
    for name, header in response[0].get("headers", {}).items():
        value = resp.headers.get(name)
        if value is None:
            continue
        header, pointer = document.resolve(header, f"{response[1]}/headers/{_escape(name)}")
        schema = header.get("schema")
        if schema is None:
            continue
        instance: Any = value
        if schema.get("type") in ("integer", "number"):
            try:
                instance = int(value) if schema["type"] == "integer" else float(value)
            except ValueError:
                yield f"header {name}: {value[:64]!r} is not {schema['type']}"
                continue
        problem = _schema_failure(document, f"{pointer}/schema", instance, f"header {name}")
        if problem is not None:
            yield problem


def _json(document: Document, media: tuple[dict[str, Any], str], data: bytes) -> Iterator[str]:
    if "schema" not in media[0]:
        return
    try:
        body = json.loads(data)
    except ValueError as exc:
        yield f"the body is not JSON: {exc}"
        return
    problem = _schema_failure(document, f"{media[1]}/schema", body, "the body")
    if problem is not None:
        yield problem


def _events(
    document: Document, media: tuple[dict[str, Any], str], data: bytes, complete: bool
) -> Iterator[str]:
    """Each event against ``itemSchema``, and its JSON ``data`` against the ``contentSchema``
    given there. A stream cut short is checked as far as its last complete event."""
    item = media[0].get("itemSchema")
    if item is None:
        yield "an event stream documented without itemSchema"
        return
    if not complete:
        data = data[: data.rfind(b"\n\n") + 2]  # (an event ends with a blank line)
    item, pointer = document.resolve(item, f"{media[1]}/itemSchema")
    payload = item.get("properties", {}).get("data", {})
    content_schema = payload.get("contentSchema")
    for i, ev in enumerate(sse_events(data)):
        problem = _schema_failure(document, pointer, ev, f"event {i}")
        if problem is not None:
            yield problem
            continue
        if content_schema is None or payload.get("contentMediaType") != JSON:
            continue
        try:
            parsed = json.loads(ev["data"])
        except ValueError as exc:
            yield f"event {i}: data is not JSON: {exc}"
            continue
        problem = _schema_failure(
            document, f"{pointer}/properties/data/contentSchema", parsed, f"event {i}'s data"
        )
        if problem is not None:
            yield problem


class Recorder:
    """Records every response of the ``aiohttp.ClientSession`` its :attr:`trace_config` is given
    to (``ClientSession(trace_configs=[recorder.trace_config])``), with a copy of each body."""

    def __init__(self) -> None:
        self.recorded: list[Recorded] = []
        self.trace_config = TraceConfig()
        self.trace_config.on_request_end.append(self._on_request_end)

    async def _on_request_end(
        self, session: ClientSession, context: Any, params: TraceRequestEndParams
    ) -> None:
        resp = params.response
        self.recorded.append(Recorded(params.method.upper(), resp.url, resp, tee(resp.content)))

    async def failures(self, document: Document, app: web.Application) -> list[str]:
        """Every way a recorded response departs from ``document``, routed as ``app`` routes
        (a gateway in another process routes as ``create_app(settings, engines={})`` does)."""
        return [f for rec in self.recorded for f in await check(document, app, rec)]

    def forget(self) -> None:
        """Drop the body copies (the responses are done with)."""
        for rec in self.recorded:
            _TEED.pop(id(rec.response.content), None)


class RecordingClient(TestClient[web.Request, web.Application]):
    """A ``TestClient`` that records every response for :meth:`conformance_failures`."""

    def __init__(self, server: Any, **kwargs: Any) -> None:
        self.recorder = Recorder()
        super().__init__(server, trace_configs=[self.recorder.trace_config], **kwargs)

    @property
    def recorded(self) -> list[Recorded]:
        return self.recorder.recorded

    async def conformance_failures(self) -> list[str]:
        """Every way a recorded response departs from the document the app serves."""
        app = self.app
        assert app is not None
        return await self.recorder.failures(document_for(app), app)

    async def close(self) -> None:
        await super().close()
        self.recorder.forget()
