"""Install OpenAI-shaped error responses on a FastAPI app.

Every `errors.GatewayError` becomes `{"error": {...}}` with its status and
headers (e.g. Retry-After on 429); request validation failures become 400
`invalid_request_error` naming the offending field; unknown routes and
methods keep their status with the same body shape.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import errors


def error_response(exc: errors.GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _param(loc: tuple[object, ...] | list[object]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


def install_error_handlers(app: FastAPI, *, validation_status: int = 400) -> None:
    """Register the handlers; `validation_status` 400 (OpenAI) or 422 (FastAPI's default)."""

    async def on_gateway_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, errors.GatewayError)
        return error_response(exc)

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"msg": "Invalid request.", "loc": ()}
        param = _param(first.get("loc", ()))
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
        err = errors.InvalidRequest(message, param=param, code="invalid_value")
        return JSONResponse(err.body(), status_code=validation_status)

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = errors.GatewayError(str(exc.detail))
        body = err.body()
        body["error"]["type"] = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    app.add_exception_handler(errors.GatewayError, on_gateway_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
