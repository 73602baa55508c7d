"""What a browser may make the gateway do.

Each check (``require_json_content_type``: 415; ``allowed_hosts``: 421; ``cors_origins``) and
what it protects against: docs/security.md, "Connections and browsers". The headers a page may
send and read are those the route table declares (:mod:`gateway.http.routing`).

Each check is a wrapper chosen at route registration (none when its setting is off), in keeping
with the edge's no-middleware rule (:mod:`gateway.http.edge`).
"""

from __future__ import annotations

import ipaddress

from aiohttp import web
from multidict import CIMultiDictProxy

from gateway.errors import MisdirectedRequest, UnsupportedMediaType
from gateway.http.errors import Handler

CORS_MAX_AGE_S = 600


def check_json_content_type(headers: CIMultiDictProxy[str]) -> None:
    """415 unless the request's Content-Type is JSON (``application/json``, ``+json``)."""
    value = headers.get("Content-Type")
    if value == "application/json":  # (what nearly every client sends: no parsing)
        return
    if value is not None:
        media = value.partition(";")[0].strip().lower()
        if media == "application/json" or (
            media.startswith("application/") and media.endswith("+json")
        ):
            return
    raise UnsupportedMediaType(
        "this route reads a JSON body: send 'Content-Type: application/json'",
        code="unsupported_media_type",
    )


def host_of(request: web.Request) -> str:
    """The Host header's host part, lowercased (an IPv6 literal keeps its brackets)."""
    host = request.headers.get("Host", "").strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if ":" in host else host


# The Host names a loopback bind answers by default: what a local client (a browser at
# http://localhost:8080, curl at 127.0.0.1) sends. A DNS-rebinding page sends its own name.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ANY_HOST = "*"
# Names a 421 lists (the setting may hold many).
LISTED_HOSTS = 8


def is_loopback(address: str) -> bool:
    """Whether a listening address (``host``) is reachable from this machine only."""
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def served_hosts(allowed_hosts: tuple[str, ...], bind: str) -> frozenset[str]:
    """The Host names the gateway answers (empty: any). ``allowed_hosts`` when set (``*``: any);
    unset, a loopback bind answers loopback names only and any other bind answers any name."""
    if ANY_HOST in allowed_hosts:
        return frozenset()
    if allowed_hosts:
        return frozenset(allowed_hosts)
    if not is_loopback(bind):
        return frozenset()
    own = bind.strip().lower().strip("[]")
    literal = f"[{own}]" if ":" in own else own
    return frozenset((*LOOPBACK_HOSTS, literal))


# Set on a request that a listener of its own has checked against its own bind's names (the ops
# listener, gateway.http.connections.ops_server): the routes' check, made for the serving port's
# bind, steps aside (read only when that check fails: nothing on the hot path).
HOST_CHECKED = web.RequestKey("host_checked", bool)


def host_checked(allowed: frozenset[str], handler: Handler) -> Handler:
    """``handler`` behind the Host allow-list."""
    order = {name: i for i, name in enumerate(LOOPBACK_HOSTS)}
    names = sorted(allowed, key=lambda n: (order.get(n, len(order)), n))
    shown = ", ".join(names[:LISTED_HOSTS]) + (", ..." if len(names) > LISTED_HOSTS else "")
    # The name sent is not echoed: it is whatever the client sent.
    message = (
        f"this gateway answers only the host names {shown}; the setting allowed_hosts "
        f"(--allowed-hosts, VOXGATE_ALLOWED_HOSTS) lists others, or '*' for any"
    )

    async def check_host(request: web.Request) -> web.StreamResponse:
        if host_of(request) not in allowed and HOST_CHECKED not in request:
            raise MisdirectedRequest(message, param="allowed_hosts", code="unknown_host")
        return await handler(request)

    check_host.__name__ = getattr(handler, "__name__", "handler")
    check_host.__doc__ = handler.__doc__
    return check_host


def allowed_origin(request: web.Request, origins: frozenset[str]) -> str | None:
    """The request's Origin when ``origins`` allows it (``*``: any), else None."""
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    if "*" in origins or origin.lower() in origins:
        return origin
    return None


def add_cors(app: web.Application, origins: frozenset[str], exposed: str) -> None:
    """Send CORS headers to allowed origins on every response, ``exposed`` naming the response
    headers a page may read (only when ``origins`` is set: a response-prepare signal with no
    receivers costs nothing)."""
    if not origins:
        return

    async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = allowed_origin(request, origins)
        if origin is None:
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = exposed
        vary = response.headers.get("Vary")
        if vary is None:
            response.headers["Vary"] = "Origin"
        elif "origin" not in vary.lower():
            response.headers["Vary"] = f"{vary}, Origin"

    app.on_response_prepare.append(cors_headers)


def preflight(
    request: web.Request, origins: frozenset[str], allowed: str, headers: str
) -> web.Response | None:
    """The answer to a CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from
    an allowed origin for a method the path serves, allowing the request ``headers``; None when
    it is not one."""
    if request.method != "OPTIONS" or not origins:
        return None
    asked = request.headers.get("Access-Control-Request-Method")
    origin = allowed_origin(request, origins)
    if asked is None or origin is None:
        return None
    if asked.upper() not in [m.strip() for m in allowed.split(",")]:
        return None
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": allowed,
            "Access-Control-Allow-Headers": headers,
            "Access-Control-Max-Age": str(CORS_MAX_AGE_S),
            "Vary": "Origin",
        },
    )
