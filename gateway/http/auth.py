"""Who may call a route: each route is declared with one of the accesses here
(:class:`gateway.http.routing.Access`; the table: gateway.http.routes), and every route that
needs a key is wrapped, at registration, by :func:`guarded`.

Open routes get no wrapper at all, so they pay nothing; with no keys file every guard is one
attribute read. The key's scopes must include one of the route's. How a key is sent, and that
only its *name* reaches the logs and metrics, never the secret: docs/security.md, "API keys".
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDictProxy

from gateway.errors import Forbidden, Unauthorized
from gateway.http import keys
from gateway.http.charging import charged
from gateway.http.errors import Handler
from gateway.http.origins import check_json_content_type
from gateway.http.routing import Access
from gateway.runtime.apikeys import SCOPES

OPEN = Access("open", frozenset())
# A signed say URL: its handler checks the signature and answers 403 for a bad or expired one.
SIGNED = Access("signature", frozenset())
SPEAK = Access("speak", frozenset({"speak"}))
READ = Access("read", frozenset({"read"}), capability=True)
ADMIN = Access("admin", frozenset({"admin"}))
# /metrics with metrics_auth: an operator's key, or a key made for Prometheus that can do nothing
# else.
METRICS = Access("metrics", frozenset({"admin", "metrics"}))
# Listings (models, voices): any valid key. They name what a client may ask for, so whoever holds
# a key of any scope may read them; a caller without a key learns nothing.
ANY_KEY = Access("any key", frozenset(SCOPES))


def presented_secret(headers: CIMultiDictProxy[str]) -> str | None:
    """The secret in ``Authorization: Bearer`` (scheme case-insensitive) or ``X-API-Key``."""
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, secret = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and secret.strip():
            return secret.strip()
    key = headers.get("X-API-Key")
    if key is not None and key.strip():
        return key.strip()
    return None


def guarded(access: Access, handler: Handler, *, json_body: bool = False) -> Handler:
    """``handler`` behind ``access``'s check (``handler`` itself for an open route), and, with
    ``json_body``, behind a JSON Content-Type check (415; :mod:`gateway.http.origins`). One
    wrapper does both, so a guarded JSON route costs one frame."""
    if not access.scopes and not json_body:
        return handler
    needed = access.scopes
    capability = access.capability
    scope_text = " or ".join(sorted(needed))

    async def guard(request: web.Request) -> web.StreamResponse:
        ring = request.app[keys.AUTH].ring if needed else None
        if ring is None:
            if json_body:
                check_json_content_type(request.headers)
            return await handler(request)
        secret = presented_secret(request.headers)
        # A content address while public_audio_urls is on is a capability: a key is 256 bits
        # only the gateway hands out. Players that cannot send headers (Asterisk, FreeSWITCH,
        # Twilio) fetch these.
        public = capability and request.app[keys.SETTINGS].public_audio_urls
        if secret is None:
            if public:
                return await handler(request)
            raise Unauthorized(
                "this route needs an API key: send 'Authorization: Bearer <key>' or "
                "'X-API-Key: <key>'",
                code="missing_api_key",
            )
        key = ring.identify(secret)
        if key is None:
            raise Unauthorized("invalid API key", code="invalid_api_key")
        request[keys.CLIENT_NAME] = key.name
        limits = request.app[keys.LIMITS]
        # A public content address is read with any valid key, as without one: a speak-only
        # client may fetch the audio its own answers name.
        if not key.scopes & needed and not public:
            limits.count(key.name, "forbidden")
            raise Forbidden(
                f"API key {key.name!r} lacks the scope this route needs ({scope_text})",
                code="insufficient_scope",
            )
        if json_body:
            check_json_content_type(request.headers)
        return await charged(request, key, handler)

    guard.__name__ = getattr(handler, "__name__", "handler")
    guard.__doc__ = handler.__doc__
    return guard
