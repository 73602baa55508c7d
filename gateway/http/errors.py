"""The one place every error becomes an HTTP response.

Errors are answered in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so an
OpenAI client shows them as it shows OpenAI's own.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import RequestHandler
from pydantic import Field
from typing_extensions import TypedDict

from gateway.errors import (
    BadGateway,
    BadRequest,
    ErrorType,
    MethodNotAllowed,
    NotFound,
    RequestTimeout,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    VoxgateError,
    clip,
)
from synth.errors import (
    OWN_REFUSALS,
    ClientQueueFull,
    EngineDead,
    EngineError,
    Overloaded,
    SynthesisError,
    SynthesisTimeout,
    TakeRejected,
    UnspeakableInput,
    UpstreamError,
)

log = logging.getLogger("voxgate.gateway")


class ErrorObject(TypedDict):
    """What went wrong (OpenAI's error object)."""

    message: Annotated[str, Field(description="Safe to show; never echoes the text.")]
    type: ErrorType
    param: Annotated[str | None, Field(description="The field at fault.")]
    code: Annotated[str | None, Field(description="Why, as a stable identifier.")]


class Error(TypedDict):
    """The body of every error answer (OpenAI's shape)."""

    error: ErrorObject


# The longest message an error carries. Messages clip what they echo (gateway.errors.clip);
# this is the backstop for one that does not, so no request can make an error body large.
MAX_MESSAGE_CHARS = 1024


def error_object(
    message: str, type_: ErrorType, param: str | None = None, code: str | None = None
) -> ErrorObject:
    """An error in OpenAI's shape, ``{"message", "type", "param", "code"}``, bounded in size."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    if param is not None and len(param) > 128:
        param = param[:125] + "..."
    return {"message": message, "type": type_, "param": param, "code": code}


def error_response(
    exc: VoxgateError, status: int | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    """The HTTP response for ``exc`` (``status`` replacing its own, and ``headers``, if given)."""
    headers = {**(headers or {})}
    if exc.retry_after_s is not None and math.isfinite(exc.retry_after_s):
        # Whole seconds, at least 1, at most a day: whatever a component computed.
        headers["Retry-After"] = str(min(86400, max(1, round(exc.retry_after_s))))
    if isinstance(exc, MethodNotAllowed):
        headers["Allow"] = exc.allow
    elif isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="voxgate"'
    elif isinstance(exc, RequestTimeout):
        headers["Connection"] = "close"  # the rest of the body may still be on its way
    body: Error = {"error": error_object(exc.message, exc.type, exc.param, exc.code)}
    return web.Response(
        status=status or exc.status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def from_synthesis_error(exc: SynthesisError) -> VoxgateError:
    """Map a synthesis failure to its HTTP error."""
    if isinstance(exc, UpstreamError):
        return _upstream_error(exc)
    if isinstance(exc, TakeRejected):
        return BadGateway(str(exc), code="take_rejected")
    if isinstance(exc, ClientQueueFull):
        return TooManyRequests(
            str(exc), code="client_queue_full", retry_after_s=exc.retry_after_s or 1.0
        )
    if isinstance(exc, Overloaded):
        return Unavailable(str(exc), code="queue_full", retry_after_s=exc.retry_after_s or 1.0)
    if isinstance(exc, UnspeakableInput):
        return BadRequest(str(exc), param="input", code="nothing_to_speak")
    if isinstance(exc, (EngineDead, SynthesisTimeout)):
        return Unavailable(str(exc), code="engine_unavailable", retry_after_s=exc.retry_after_s)
    if isinstance(exc, EngineError):
        return VoxgateError(str(exc), code="engine_error")
    return VoxgateError("synthesis failed", code="engine_error")


def _upstream_error(exc: UpstreamError) -> VoxgateError:
    """An upstream's failure as the status it carries: 400 with the provider's message when the
    caller's request was refused, 503 (with Retry-After) when it is unavailable for now, 502."""
    param = OWN_REFUSALS.get(exc.kind)
    if param is not None:
        return BadRequest(str(exc), param=param, code=exc.kind)
    code = f"upstream_{exc.kind}"
    if 400 <= exc.status < 500:
        return BadRequest(str(exc), code=code)
    if exc.status == 503:
        return Unavailable(str(exc), code=code, retry_after_s=exc.retry_after_s or 1.0)
    return BadGateway(str(exc), code=code, retry_after_s=exc.retry_after_s)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The reason a 4xx without an error code of ours is counted under (a bounded set).
_REASONS = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    416: "range_not_satisfiable",
}


def rejection_reason(status: int, exc: BaseException | None) -> str | None:
    """Why a request was answered ``status``, if its input caused it (a 4xx); else None.

    The reason is the error code when ``exc`` carries one of ours (codes are literals in this
    code base, so the label stays bounded), else named by the status. 499 is the client leaving,
    not its input.
    """
    if not 400 <= status < 500 or status == 499:
        return None
    if isinstance(exc, VoxgateError) and exc.code:
        return exc.code
    return _REASONS.get(status, "invalid")


def error_response_for(request: web.Request, exc: Exception) -> web.Response:
    """The JSON error response for any failure of a handler.

    Our own errors and synthesis failures say what is wrong; aiohttp's HTTP errors (a body over
    ``client_max_size``) keep their status; anything else is a bug: logged with its traceback
    and the route (never the request text) and answered 500, and the server keeps serving.
    A 2xx/3xx ``HTTPException`` (a redirect) is raised again for aiohttp to send.
    """
    if isinstance(exc, VoxgateError):
        return error_response(exc)
    if isinstance(exc, SynthesisError):
        return error_response(from_synthesis_error(exc))
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        message = exc.text or exc.reason
        if exc.status == 413:
            message = "request body too large"
        error = NotFound(message) if exc.status == 404 else BadRequest(message)
        return error_response(error, exc.status)
    if isinstance(exc, web.RequestPayloadError):
        # The body as aiohttp decodes it, failing: a Content-Encoding that does not decode
        # (gzip that is not gzip), chunked framing that breaks mid-body. The client's fault.
        cause = exc.__cause__ or (exc.args[0] if exc.args else None)
        why = cause.message if isinstance(cause, HttpProcessingError) else "it does not decode"
        refused = error_response(
            BadRequest(f"malformed request body: {clip(why, 80)}", code="malformed_body")
        )
        refused.force_close()  # (the rest of the body cannot be read: the connection ends)
        return refused
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "?"
    if isinstance(exc, ConnectionResetError):
        # The client went away mid-answer: nothing to send it, nothing wrong with us.
        log.info("client went away during %s %s", request.method, route)
        return web.Response(status=499, reason="Client Closed Request")
    log.error("unexpected error answering %s %s", request.method, route, exc_info=exc)
    return error_response(VoxgateError("internal error: the gateway failed to answer; see its log"))


# The one answer to a request aiohttp's parser refuses: nothing the client sent is in it.
MALFORMED = BadRequest(
    "the request is not well-formed HTTP (a request line or header the parser refuses)",
    code="malformed_request",
)


class PlainRefusals(RequestHandler):
    """aiohttp's request handler with the answer to a request its parser refuses made fixed:
    aiohttp's plain-text 400 quotes the offending line, so a header with a control byte sent
    its API key straight back (to whoever relays or logs responses). 5xx answers are aiohttp's."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        answer = super().handle_error(request, status, exc, message)  # (logs, as aiohttp does)
        if status >= 500:
            return answer
        fixed = error_response(MALFORMED, status=status)
        fixed.force_close()
        return fixed

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # A body that does not decode (gzip that is not gzip) got its 400 from the handler;
        # aiohttp then reads the rest of it to keep the connection (its lingering read), fails
        # again and would log a traceback per such request: the client's fault, answered.
        if isinstance(kw.get("exc_info"), web.RequestPayloadError):
            self.log_debug("the rest of a body that does not decode was dropped")
            return
        super().log_exception(*args, **kw)
