"""A request on an API key's account: what every path that can cause work does once it knows
which key asked (the route guard, a signed say URL's signer, a WebSocket's messages).

The key's ``requests_per_minute`` is checked (429 beyond), the request counted by key, the key
named as the client whose queue share its misses take, and the key made the caller whose
``chars_per_minute`` its misses spend (:mod:`gateway.speech.caller`).
"""

from __future__ import annotations

from aiohttp import web

from gateway.http import keys
from gateway.http.errors import Handler
from gateway.runtime.apikeys import APIKey
from gateway.speech.caller import charged_to


async def admit(request: web.Request, key: APIKey) -> None:
    """Charge one request to ``key`` (429 past its requests_per_minute) and count it."""
    limits = request.app[keys.LIMITS]
    if key.requests_per_minute:  # (only keys with a limit pay for a check)
        await limits.admit_request(key)
    limits.count(key.name, "ok")


async def charged(request: web.Request, key: APIKey, handler: Handler) -> web.StreamResponse:
    """Run ``handler`` on ``key``'s account (see the module)."""
    request[keys.CLIENT_NAME] = key.name
    await admit(request, key)
    with charged_to(key):
        return await handler(request)
