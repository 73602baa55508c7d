"""The gateway's exception root and the one place every error becomes an HTTP response.

Errors are answered in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so an
OpenAI client shows them as it shows OpenAI's own. Messages are safe to show: they never contain
request text or secrets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from synth.errors import EngineDead, EngineError, Overloaded, SynthesisError, SynthesisTimeout

log = logging.getLogger("voxgate.gateway")


class VoxgateError(Exception):
    """Root of errors raised at the HTTP edge. ``status`` and ``type`` choose the response."""

    status = 500
    type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s


class BadRequest(VoxgateError):
    """The request is invalid; the message says what is wrong and ``param`` which field."""

    status = 400
    type = "invalid_request_error"


class NotFound(VoxgateError):
    """No such resource."""

    status = 404
    type = "not_found_error"


class PayloadTooLarge(VoxgateError):
    """The body is larger than the configured bound."""

    status = 413
    type = "invalid_request_error"


class Unavailable(VoxgateError):
    """Recoverable: overloaded, warming up, or a worker died. Carries Retry-After."""

    status = 503
    type = "server_overloaded"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    """Serialize an error in OpenAI's shape."""
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    ).encode()


def error_response(exc: VoxgateError) -> web.Response:
    """The HTTP response for ``exc``."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return web.Response(
        status=exc.status,
        body=error_body(exc.message, exc.type, exc.param, exc.code),
        content_type="application/json",
        headers=headers,
    )


def from_synthesis_error(exc: SynthesisError) -> VoxgateError:
    """Map a synthesis failure to its HTTP error."""
    if isinstance(exc, Overloaded):
        return Unavailable(str(exc), code="queue_full", retry_after_s=exc.retry_after_s or 1.0)
    if isinstance(exc, (EngineDead, SynthesisTimeout)):
        return Unavailable(str(exc), code="engine_unavailable", retry_after_s=exc.retry_after_s)
    if isinstance(exc, EngineError):
        err = VoxgateError(str(exc), code="engine_error")
        return err
    return VoxgateError("synthesis failed", code="engine_error")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HTTP_TYPES = {404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error"}


async def handle_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Run ``handler``; turn every failure into a JSON error response."""
    try:
        return await handler(request)
    except VoxgateError as exc:
        return error_response(exc)
    except SynthesisError as exc:
        return error_response(from_synthesis_error(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text or exc.reason
        if exc.status == 413:
            message = "request body too large"
        elif exc.status == 404:
            message = f"no route for {request.method} {request.path}"
        elif exc.status == 405:
            message = f"method {request.method} not allowed on {request.path}"
        return web.Response(
            status=exc.status,
            body=error_body(message, _HTTP_TYPES.get(exc.status, "invalid_request_error")),
            content_type="application/json",
            headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"},
        )
