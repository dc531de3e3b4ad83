"""The gateway's ASGI application: FastAPI, with a shortcut for the hot routes
and a body-size limit for the routes FastAPI parses itself.

`GatewayApp` is a `FastAPI` app that serves a few POST endpoints (the
OpenAI completion routes) without FastAPI's routing, dependency solving and
middleware layers: the same endpoint function, called with a `Request`,
its `Response` (or the app's own exception handlers' answer) sent as is.
That saved 100-180 µs of CPU per request here (docs/benchmarks.md). Only
endpoints that take nothing but the `Request` qualify (`hot_endpoint`);
everything else, the lifespan included, goes through FastAPI unchanged.
With tracing on, the app opens a hot request's trace itself (`tracer`),
tells it the answer's status and hands it to an event stream, which tells
it of its first and last body message; the routes FastAPI serves get the
tracing middleware (`wrap_outer`).

`BodySizeLimit` answers 413 (OpenAI-shaped) for a request under `prefix`
whose body is larger than `limit` bytes, declared or streamed, before the
app reads it; the body is then replayed to the app.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http import errors
from gateway.http.error_responses import error_response
from gateway.http.sse import EventStreamResponse

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]


class TracedCall(Protocol):
    """A traced request as the app serves it (gateway.telemetry's `Turn`)."""

    def responded(self, status: int) -> None: ...
    def sending(self, total: int, last: bool) -> None: ...
    def failed(self, exc: BaseException) -> None: ...
    def finish(self) -> None: ...


class CallTracer(Protocol):
    """Opens a request's trace (gateway.telemetry's `TurnOpener`); None: not traced."""

    def open(self, scope: Scope) -> TracedCall | None: ...


def hot_endpoint(route: object) -> Endpoint | None:
    """`route`'s endpoint when it can be called as `endpoint(request)`, else None."""
    if not isinstance(route, APIRoute) or route.dependencies:
        return None
    params = list(inspect.signature(route.endpoint).parameters.values())
    if len(params) != 1 or params[0].annotation not in (Request, "Request"):
        return None
    return route.endpoint


class GatewayApp(FastAPI):
    """FastAPI plus `hot` routes: path -> (route, endpoint), POST only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hot: dict[str, tuple[APIRoute, Endpoint]] = {}
        # An ASGI middleware around the routes FastAPI serves (tracing); None: none.
        self.outer: ASGIApp | None = None
        # Traces the hot routes inline (no middleware frame or send wrapper); None: off.
        self.tracer: CallTracer | None = None

    def wrap_outer(self, middleware: Callable[[ASGIApp], ASGIApp]) -> None:
        """Put `middleware(app)` in front of every request FastAPI serves (not the hot routes)."""
        self.outer = middleware(self._fastapi)

    def add_hot_route(self, route: APIRoute) -> bool:
        """Serve `route` (POST) without FastAPI's routing layers; False if it does not qualify."""
        endpoint = hot_endpoint(route)
        if endpoint is None or "POST" not in route.methods:
            return False
        self.hot[route.path] = (route, endpoint)
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            hot = self.hot.get(scope["path"])
            if hot is not None:
                call = self.tracer.open(scope) if self.tracer is not None else None
                if call is None:
                    await self._serve_hot(hot, scope, receive, send)
                else:
                    await self._serve_traced(call, hot, scope, receive, send)
                return
        if self.outer is not None:
            await self.outer(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    async def _answer(self, hot: tuple[APIRoute, Endpoint], scope: Scope, receive: Receive, send: Send) -> Response:
        route, endpoint = hot
        scope["app"] = self
        scope["route"] = route  # what the error observer labels the request with
        request = Request(scope, receive, send)
        try:
            return await endpoint(request)
        except Exception as exc:  # noqa: BLE001  # the app's handlers log and answer it, as FastAPI's would
            return await self._handle(request, exc)

    async def _serve_hot(self, hot: tuple[APIRoute, Endpoint], scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._answer(hot, scope, receive, send)
        await response(scope, receive, send)

    async def _serve_traced(
        self, call: TracedCall, hot: tuple[APIRoute, Endpoint], scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            response = await self._answer(hot, scope, receive, send)
            call.responded(response.status_code)
            if isinstance(response, EventStreamResponse):  # others send one body message: no relay
                response.relay = call
            await response(scope, receive, send)
        except BaseException as exc:
            call.failed(exc)
            raise
        finally:
            call.finish()

    async def _handle(self, request: Request, exc: Exception) -> Response:
        """The app's own exception handler for `exc` (the nearest class in its MRO)."""
        for cls in type(exc).__mro__:
            handler = self.exception_handlers.get(cls)
            if handler is not None:
                result = handler(request, exc)
                return await result if inspect.isawaitable(result) else result
        raise exc


class BodySizeLimit:
    """ASGI middleware: 413 for bodies over `limit` bytes on paths under `prefix`."""

    def __init__(self, app: ASGIApp, *, limit: int, prefix: str) -> None:
        self.app = app
        self.limit = limit
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        too_large = errors.PayloadTooLarge(f"request body exceeds {self.limit} bytes")
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await error_response(too_large)(scope, receive, send)
                return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body was in
            part = message.get("body", b"")
            size += len(part)
            if size > self.limit:
                await error_response(too_large)(scope, receive, send)
                return
            parts.append(part)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(parts), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
