"""gateway.telemetry._middleware: a traced POST under /v1/ gets its request
span (child of the client's `traceparent`), a streamed answer a `relay` span
from its first body bytes to its last with the bytes relayed, and the app sees
every message it sent, in order; other paths are not traced."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message

from core.tracing import TraceSettings
from gateway.telemetry import Tracing, TracingMiddleware
from gateway.telemetry._export import SpanQueue
from testing.fake_span_post import FakeSpanPost

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _traced(app: Any) -> tuple[TracingMiddleware, Tracing, FakeSpanPost]:
    posts = FakeSpanPost()
    queue = SpanQueue(posts, resource={"service.name": "gw"}, scope="t", delay_s=60)
    tracing = Tracing(None, queue, TraceSettings(endpoint="http://collector:4318/v1/traces"))
    return TracingMiddleware(app, tracing), tracing, posts


def _streaming(status: int, chunks: list[bytes]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        for chunk in chunks[:-1]:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": chunks[-1], "more_body": False})

    return app


def _call(mw: TracingMiddleware, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    asyncio.run(mw(scope, receive, send))
    return sent


def _attrs(span: Any) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def test_a_streamed_answer_has_its_relay_span_and_reaches_the_client_unchanged() -> None:
    chunks = [b"data: 1\n\n", b"data: 22\n\n", b"data: [DONE]\n\n"]
    mw, tracing, posts = _traced(_streaming(200, chunks))
    sent = _call(mw, "/v1/chat/completions", [(b"traceparent", PARENT.encode())])
    assert [m.get("body") for m in sent] == [None, *chunks]
    tracing.flush()
    by_name = {s.name: s for s in posts.spans()}
    assert set(by_name) == {"POST /v1/chat/completions", "relay"}
    request, relay = by_name["POST /v1/chat/completions"], by_name["relay"]
    assert request.trace_id.hex() == PARENT.split("-")[1]
    assert request.parent_span_id.hex() == PARENT.split("-")[2]
    assert relay.parent_span_id == request.span_id
    assert _attrs(request)["http.response.status_code"] == 200
    assert _attrs(relay) == {"evolving.relay.bytes": sum(len(c) for c in chunks)}
    assert request.start_time_unix_nano <= relay.start_time_unix_nano <= relay.end_time_unix_nano
    assert relay.end_time_unix_nano <= request.end_time_unix_nano


def test_a_one_write_answer_has_no_relay_span_and_a_server_error_is_an_error() -> None:
    mw, tracing, posts = _traced(_streaming(503, [b'{"error": "busy"}']))
    _call(mw, "/v1/completions")
    tracing.flush()
    (request,) = posts.spans()
    assert _attrs(request)["http.response.status_code"] == 503
    assert request.status.code == request.status.STATUS_CODE_ERROR


def test_other_paths_are_not_traced() -> None:
    mw, tracing, posts = _traced(_streaming(200, [b"a", b"b"]))
    assert len(_call(mw, "/health")) == 3
    tracing.flush()
    assert posts.spans() == []
