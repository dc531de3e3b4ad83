"""Install OpenAI-shaped error responses on a FastAPI app: the one
translator for the whole gateway (OpenAI routes and the admin API alike).

Every `errors.GatewayError` becomes `{"error": {...}}` with its status and
headers (e.g. Retry-After on 429); request validation failures become 400
`invalid_request_error` naming the offending field; unknown routes and
methods keep their status (and headers, e.g. Allow) with the same body
shape; anything else is logged and answered 500 `server_error`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.http import errors

log = logging.getLogger(__name__)

# (request, status) -> None, called for every error answered (metrics). Must not raise.
ErrorObserver = Callable[[Request, int], None]


def error_response(exc: errors.GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _param(loc: Sequence[object]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


def install_error_handlers(
    app: FastAPI, *, validation_status: int = 400, on_error: ErrorObserver | None = None
) -> None:
    """Register the handlers; `validation_status` 400 (OpenAI) or 422 (FastAPI's default)."""

    def answer(request: Request, response: JSONResponse) -> JSONResponse:
        if on_error is not None:
            on_error(request, response.status_code)
        return response

    async def on_gateway_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, errors.GatewayError)
        return answer(request, error_response(exc))

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"msg": "Invalid request.", "loc": ()}
        param = _param(first.get("loc", ()))
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
        err = errors.InvalidRequest(message, param=param, code="invalid_value")
        return answer(request, JSONResponse(err.body(), status_code=validation_status))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = errors.GatewayError(str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        body = err.body()
        body["error"]["type"] = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return answer(request, JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None)))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return answer(request, error_response(errors.GatewayError(f"internal error: {type(exc).__name__}")))

    app.add_exception_handler(errors.GatewayError, on_gateway_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
