"""The gateway's exception root: every error a request can meet, with the status it is answered
with (the answering itself is :mod:`gateway.http.errors`). Messages are safe to show: they never
contain request text or secrets.
"""

from __future__ import annotations

from typing import ClassVar, Literal

# The ``type`` of an error body: every value an error class below carries, and so every value a
# client can see (the OpenAPI document's ``Error.type`` enum is this Literal).
ErrorType = Literal[
    "invalid_request_error",
    "permission_error",
    "not_found_error",
    "rate_limit_exceeded",
    "server_overloaded",
    "server_error",
]

# Names and values a message echoes are cut to this many characters: a client's voice name or
# path can be 200 KB, and an error must not send it back (nor the access log keep it).
ECHO_CHARS = 64


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """``value`` as a message may show it: ``repr``-quoted (control characters escaped) and cut
    to about ``limit`` characters, with ``...`` where it was cut."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    return text if len(text) <= limit else text[: limit - 4] + "...'"


class VoxgateError(Exception):
    """Root of errors raised at the HTTP edge. ``status`` and ``type`` choose the response."""

    status: ClassVar[int] = 500
    type: ClassVar[ErrorType] = "server_error"

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

    def __init_subclass__(cls, status: int = 0, type: ErrorType | None = None) -> None:
        # Each error declares its answer in its class line: `class NotFound(VoxgateError,
        # status=404, type=...)`; a subclass of one inherits it.
        super().__init_subclass__()
        cls.status = status or cls.status
        cls.type = type or cls.type


class BadRequest(VoxgateError, status=400, type="invalid_request_error"):
    """The request is invalid; the message says what is wrong and ``param`` which field."""


class NotFound(VoxgateError, status=404, type="not_found_error"):
    """No such resource."""


class Unauthorized(VoxgateError, status=401, type="invalid_request_error"):
    """No API key, or one the gateway does not know (answered with ``WWW-Authenticate``)."""


class Forbidden(VoxgateError, status=403, type="permission_error"):
    """The request is understood but not allowed (a bad or expired URL signature, an API key
    without the route's scope)."""


class MethodNotAllowed(VoxgateError, status=405, type="invalid_request_error"):
    """The path exists, the method does not; ``allow`` lists the methods that do."""

    def __init__(self, message: str, *, allow: str) -> None:
        super().__init__(message)
        self.allow = allow


class PayloadTooLarge(VoxgateError, status=413, type="invalid_request_error"):
    """The body is larger than the configured bound."""


class RequestTimeout(VoxgateError, status=408, type="invalid_request_error"):
    """The request body did not arrive in time (``body_timeout_s``); the connection is closed."""


class UnsupportedMediaType(VoxgateError, status=415, type="invalid_request_error"):
    """The body's Content-Type is not one the route reads (a JSON route needs JSON)."""


class MisdirectedRequest(VoxgateError, status=421, type="invalid_request_error"):
    """The Host header names a host this gateway does not serve (``allowed_hosts``)."""


class TooManyRequests(VoxgateError, status=429, type="rate_limit_exceeded"):
    """This client asked for more than its share; carries Retry-After."""


class BadGateway(VoxgateError, status=502, type="server_error"):
    """An upstream (a remote TTS provider served as a model) failed; the message names it."""


class Unavailable(VoxgateError, status=503, type="server_overloaded"):
    """Recoverable: overloaded, warming up, or a worker died. Carries Retry-After."""
