"""The request's own span, around the whole ASGI call.

Every POST under /v1/ gets a SERVER span whose parent is the client's
`traceparent` when it sent a valid one (W3C Trace Context; a malformed one
starts a new trace, as the spec says). While the app serves it, the
request's `Turn` is current, so the serving code's span sites find it; a
streamed answer gets a `relay` span from its first body bytes to its last.
Other paths (health, metrics, admin) are not traced.

Two ways in, the same spans:

- `TurnOpener.open(scope)`: for the gateway's hot routes (`GatewayApp`
  serves them itself, `gateway.http.asgi`): the app opens the turn, tells
  it the answer's status (`Turn.responded`), hands it to the event stream,
  which tells it of its first and last body message (`Turn.sending`), and
  finishes it (`Turn.finish`). No middleware frame that every
  resumption of the request's task passes through, and no wrapper called
  for every message sent: at 16 streamed tokens those were ~15 % of the
  span code's samples in py-spy under load.
- `TracingMiddleware`: any other /v1/ POST, around the app, watching what
  it sends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.telemetry._ids import parse_traceparent
from gateway.telemetry._turn import OPERATIONS, Turn

if TYPE_CHECKING:
    from gateway.telemetry.tracing import Tracing


_SERVER = SpanKind.SERVER.value  # `SpanKind.value` is a property call


def _trace_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of an ASGI request's headers."""
    traceparent = tracestate = None
    for name, value in headers:
        if name == b"traceparent":
            traceparent = value.decode("latin-1")
        elif name == b"tracestate":
            tracestate = value.decode("latin-1")
    return traceparent, tracestate


class TurnOpener:
    """Opens the turn of a traced API request (None: not an API POST, or sampled out)."""

    def __init__(self, tracing: Tracing) -> None:
        assert tracing.sink is not None, "TurnOpener needs tracing on"
        self.sink = tracing.sink
        self.inflight = tracing.inflight

    def open(self, scope: Scope) -> Turn | None:
        """The request's turn, current from now until its `finish()`."""
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not path.startswith("/v1/"):
            return None
        remote = parse_traceparent(*_trace_headers(scope["headers"]))
        operation = OPERATIONS.get(path, "chat")
        span = self.sink.root(
            f"POST {path}",
            remote,
            _SERVER,
            {"http.request.method": "POST", "url.path": path, "gen_ai.operation.name": operation},
        )
        if span is None:  # sampled out: no turn, no child span, nothing sent to the workers
            return None
        turn = Turn(self.sink, span, self.inflight, operation)
        turn.enter()
        return turn


class TracingMiddleware:
    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.opener = TurnOpener(tracing)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        turn = self.opener.open(scope)
        if turn is None:
            await self.app(scope, receive, send)
            return

        total = 0

        def traced_send(message: Message) -> Awaitable[None]:
            # A plain function returning `send`'s awaitable: no coroutine of its own per message.
            nonlocal total
            kind = message["type"]
            if kind == "http.response.body":
                total += len(message.get("body", b""))
                turn.sending(total, not message.get("more_body", False))
            elif kind == "http.response.start":
                turn.responded(message["status"])
            return send(message)

        try:
            await self.app(scope, receive, traced_send)
        except BaseException as exc:
            turn.failed(exc)
            raise
        finally:
            turn.finish()
