"""What a route declaration says, and what is derived from it.

A :class:`Route` states everything about one method and path once (after FastAPI's ``APIRoute``):
its handler, who may call it (an :class:`Access`; those there are: :mod:`gateway.http.auth`),
what it reads (a request body model and its media types, query and path parameters, request
headers), what it answers per status (JSON bodies by the types the code builds them as, audio by
media type, server-sent events by their event types) and its prose. The table of them (:mod:`gateway.http.routes`) is then read,
and nothing else is, by:

- the registration (:func:`gateway.http.edge.add_routes`): each handler wrapped once, behind its
  access check and, for a JSON-only body, the JSON Content-Type check (:attr:`Route.json_only`);
- CORS (:mod:`gateway.http.origins`): the request headers a preflight allows and the response
  headers a page may read (:func:`cors_request_headers`, :func:`cors_response_headers`);
- the OpenAPI document (:mod:`gateway.http.openapi`), including the answers those wrappers add
  (:func:`wrapper_statuses`);
- the connection cap's probe slots (:attr:`RouteTable.probe_paths`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.api.models import RequestModel
from gateway.http.errors import Handler
from gateway.http.requestid import HEADER as REQUEST_ID_HEADER

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Access:
    """What a route asks of its caller: a key with one of ``scopes`` (none: open to all).

    ``capability``: the URL is a content address, so while public_audio_urls is on it authorizes
    itself: read without a key, or with any valid one (:func:`gateway.http.auth.guarded`).
    """

    name: str
    scopes: frozenset[str]
    capability: bool = False


@dataclass(frozen=True, slots=True)
class Header:
    """A header a route reads or answers with. ``component``: a request header many routes
    read, described once under that name in the document."""

    name: str
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})
    description: str = ""
    component: str = ""


@dataclass(frozen=True, slots=True)
class Param:
    """A path parameter, or a query parameter no request model states."""

    name: str
    where: Literal["path", "query"]
    schema: Mapping[str, Any]
    description: str = ""
    required: bool = True


@dataclass(frozen=True, slots=True)
class Body:
    """A request body: the model it is validated with, and the media types it may be sent as."""

    model: type[RequestModel]
    media: tuple[str, ...] = (JSON,)


@dataclass(frozen=True, slots=True)
class Json:
    """A JSON body the code builds as ``model`` (a TypedDict; its schema is generated from it);
    None: some JSON object."""

    model: type | None = None


@dataclass(frozen=True, slots=True)
class Binary:
    """Bytes of the media type it is listed under (audio)."""


@dataclass(frozen=True, slots=True)
class Text:
    """Text of the media type it is listed under (a page, the metrics exposition)."""


@dataclass(frozen=True, slots=True)
class Events:
    """A ``text/event-stream`` of JSON events, one of ``types`` each (told apart by their
    ``type``), described together as ``name``."""

    name: str
    types: tuple[type, ...]
    description: str = ""


Media = Json | Binary | Text | Events


@dataclass(frozen=True, slots=True)
class Answer:
    """One status's answer: its body per media type (none: no body) and its headers."""

    description: str
    content: Mapping[str, Media] = field(default_factory=dict)
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class Route:
    """Everything about one method and path.

    ``answers`` are this route's own; ``common`` names statuses answered as every route answers
    them (an error, 304), described once in :attr:`RouteTable.common`. The statuses the wrappers
    every request passes add (key checks, Content-Type, body reading, the Host allow-list) are
    derived, not listed: :func:`wrapper_statuses`.
    """

    method: Literal["GET", "POST"]
    path: str
    handler: Handler
    access: Access
    tag: str
    summary: str
    description: str = ""
    body: Body | None = None
    query: type[RequestModel] | None = None
    params: tuple[Param, ...] = ()
    headers: tuple[Header, ...] = ()
    answers: Mapping[int, Answer] = field(default_factory=dict)
    common: tuple[int, ...] = ()
    operation_id: str = ""
    # A health probe: answered past the connection cap too (gateway.http.connections).
    probe: bool = False

    @property
    def json_only(self) -> bool:
        """Whether the body is JSON only: refused with 415 under any other Content-Type
        (``require_json_content_type``; :mod:`gateway.http.origins` says why)."""
        return self.body is not None and self.body.media == (JSON,)

    @property
    def keyed(self) -> bool:
        """Whether a key is asked for (when the server has a keys file)."""
        return bool(self.access.scopes)


@dataclass(frozen=True, slots=True)
class Common:
    """An answer many routes give, described once: its component name and the answer."""

    name: str
    answer: Answer


@dataclass(frozen=True, slots=True)
class RouteTable:
    """The routes, in registration order (aiohttp matches in that order), and the answers they
    share by status."""

    routes: tuple[Route, ...]
    common: Mapping[int, Common]

    def without(self, method: str, path: str) -> RouteTable:
        """This table less the route ``method path``."""
        kept = tuple(r for r in self.routes if (r.method, r.path) != (method, path))
        if len(kept) == len(self.routes):
            raise LookupError(f"no route {method} {path}")
        return RouteTable(kept, self.common)

    @property
    def probe_paths(self) -> frozenset[str]:
        """The paths of the health probes."""
        return frozenset(r.path for r in self.routes if r.probe)


def wrapper_statuses(route: Route, *, require_json: bool, host_check: bool) -> tuple[int, ...]:
    """What the wrappers ``route`` is registered behind may answer, and reading its body:
    401/403/429 for a key check (:func:`gateway.http.auth.guarded`: a missing or unknown key,
    a lacking scope, a key over its limits), 415 for a JSON-only body, 408/413 for a body (too
    slow, too large), 421 for the Host allow-list."""
    statuses: list[int] = []
    if route.keyed:
        statuses += [401, 403, 429]
    if route.body is not None:
        statuses += [408, 413]
        if require_json and route.json_only:
            statuses.append(415)
    if host_check:
        statuses.append(421)
    return tuple(statuses)


def cors_request_headers(routes: Iterable[Route]) -> str:
    """The request headers a cross-origin page may send (``Access-Control-Allow-Headers``):
    the key headers where a route asks for a key, Content-Type where one takes a body, every
    header a route reads, and X-Request-Id."""
    routes = tuple(routes)
    names = ["Authorization", "X-API-Key"] if any(r.keyed for r in routes) else []
    if any(r.body is not None for r in routes):
        names.append("Content-Type")
    names += [h.name for r in routes for h in r.headers]
    return ", ".join(dict.fromkeys([*names, str(REQUEST_ID_HEADER)]))


# Response headers every page may read without being named (the CORS-safelisted ones; Fetch has
# since added Content-Length, which older browsers still need named), and hop-by-hop ones.
_READABLE = {"cache-control", "content-language", "content-type", "expires", "last-modified"}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding"}


def cors_response_headers(table: RouteTable) -> str:
    """The response headers a cross-origin page may read (``Access-Control-Expose-Headers``):
    every header an answer of the table states, and X-Request-Id."""
    answers = [a for r in table.routes for a in r.answers.values()]
    answers += [c.answer for c in table.common.values()]
    names = [h.name for a in answers for h in a.headers]
    names = [n for n in names if n.lower() not in _READABLE | _HOP_BY_HOP]
    return ", ".join(dict.fromkeys([*names, str(REQUEST_ID_HEADER)]))
