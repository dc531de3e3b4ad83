"""The request's own span, around the whole ASGI call.

Every POST under /v1/ gets a SERVER span whose parent is the client's
`traceparent` when it sent a valid one (W3C Trace Context; a malformed one
starts a new trace, as the spec says). While the app serves it, the
request's `Turn` is current, so the serving code's span sites find it; a
streamed answer gets a `relay` span from its first body bytes to its last.
Other paths (health, metrics, admin) are not traced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.telemetry._ids import parse_traceparent
from gateway.telemetry._turn import _TURN, OPERATIONS, Span, Turn

if TYPE_CHECKING:
    from gateway.telemetry.tracing import Tracing


def _trace_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of an ASGI request's headers."""
    traceparent = tracestate = None
    for name, value in headers:
        if name == b"traceparent":
            traceparent = value.decode("latin-1")
        elif name == b"tracestate":
            tracestate = value.decode("latin-1")
    return traceparent, tracestate


class TracingMiddleware:
    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        assert tracing.sink is not None, "TracingMiddleware needs tracing on"
        self.app = app
        self.sink = tracing.sink
        self.inflight = tracing.inflight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        remote = parse_traceparent(*_trace_headers(scope["headers"]))
        operation = OPERATIONS.get(path, "chat")
        span = self.sink.root(
            f"POST {path}",
            remote,
            SpanKind.SERVER,
            {"http.request.method": "POST", "url.path": path, "gen_ai.operation.name": operation},
        )
        if span is None:  # sampled out: no turn, no child span, nothing sent to the workers
            await self.app(scope, receive, send)
            return
        turn = Turn(self.sink, span, self.inflight, operation)
        relay: Span | None = None
        sent = 0

        def traced_send(message: Message) -> Awaitable[None]:
            # A plain function returning `send`'s awaitable: no coroutine of its own per
            # message. Only the start and the first and last body messages do more than count.
            nonlocal relay, sent
            if relay is not None:
                sent += len(message.get("body", b""))
                if not message.get("more_body", False):
                    turn.end(relay, {"evolving.relay.bytes": sent})
                    relay = None
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                if message.get("more_body", False):
                    relay = turn.child("relay")
            elif message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            return send(message)

        token = _TURN.set(turn)
        try:
            await self.app(scope, receive, traced_send)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            _TURN.reset(token)
            turn.close()
            span.end()
