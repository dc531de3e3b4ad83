"""One error hierarchy for the gateway, and its translation to OpenAI-shaped
JSON: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(max(1, int(retry_after_s + 0.999)))})
        self.retry_after_s = retry_after_s


class Unavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "service_unavailable"


class RequestQuarantined(GatewayError):
    """A poison request: engines died with it on them (gateway.control.health)."""

    status = 500
    code = "request_quarantined"


class StreamCut(GatewayError):
    """A stream the gateway's own shutdown ended: its graceful window closed
    while the stream still ran (a rolling restart, `up` stopping). The
    stream cannot continue on another replica (the client's connection was
    to this one); the tokens it already got stand, the rest is not sent.
    Resend the request."""

    status = 503
    code = "gateway_shutting_down"


class UpstreamFailed(GatewayError):
    status = 502
    type = "server_error"
    code = "upstream_error"
