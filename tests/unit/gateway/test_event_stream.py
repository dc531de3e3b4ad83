"""EventStreamResponse: the ASGI messages it sends for a body, with the
stream's end riding on its last event (one write instead of two)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, MutableMapping
from typing import Any

from gateway.http.sse import EventStreamResponse
from gateway.serving.openai import sse


async def _run(events: list[bytes]) -> tuple[list[dict[str, Any]], list[str]]:
    trail: list[str] = []

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            for e in events:
                yield e
            trail.append("body ran to its end")
        finally:
            trail.append("body closed")

    async def on_close() -> None:
        trail.append("on_close")

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves
        return {}

    sent: list[dict[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await EventStreamResponse(body(), headers={}, on_close=on_close)({"type": "http"}, receive, send)
    return sent, trail


async def test_done_event_ends_the_response_in_the_same_message() -> None:
    last = b'data: {"x":1}\n\n' + sse.DONE
    sent, trail = await _run([b"data: {}\n\n", last])
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"data: {}\n\n", True), (last, False)]
    assert trail == ["body ran to its end", "body closed", "on_close"]


async def test_a_body_without_done_gets_an_empty_last_message() -> None:
    sent, trail = await _run([b"event: message_stop\ndata: {}\n\n"])
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (b"event: message_stop\ndata: {}\n\n", True),
        (b"", False),
    ]
    assert trail == ["body ran to its end", "body closed", "on_close"]


async def test_nothing_is_sent_after_done() -> None:
    sent, _ = await _run([sse.DONE, b"data: late\n\n"])
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(sse.DONE, False)]
