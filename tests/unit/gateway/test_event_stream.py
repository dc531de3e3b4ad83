"""EventStreamResponse: the ASGI messages it sends for a body, with the
stream's end riding on its last event (one write instead of two)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, MutableMapping
from typing import Any

import pytest

from gateway.http.sse import BODY_WRITE, CLIENT_GONE, EventStreamResponse
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


async def test_the_servers_client_gone_flag_stops_the_body_without_a_watch_task() -> None:
    gone = False
    trail: list[str] = []

    async def body() -> AsyncGenerator[bytes, None]:
        nonlocal gone
        try:
            yield b"data: 1\n\n"
            gone = True  # the client leaves while the next event is made
            yield b"data: 2\n\n"
            trail.append("body ran to its end")
        finally:
            trail.append("body closed")

    async def on_close() -> None:
        trail.append("on_close")

    async def receive() -> dict[str, Any]:
        raise AssertionError("the flag stands in for receive()")

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "extensions": {CLIENT_GONE: lambda: gone}}
    await EventStreamResponse(body(), headers={"X-Request-ID": "r1"}, on_close=on_close)(scope, receive, send)
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]
    assert trail == ["body closed", "on_close"]
    head = dict(sent[0]["headers"])
    assert head[b"x-request-id"] == b"r1" and head[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert head[b"cache-control"] == b"no-cache" and b"content-length" not in head


async def test_the_answers_end_goes_out_before_the_bodys_cleanup() -> None:
    """A server that writes at the end of the loop's turn (gateway.http.coalesce)
    sends the last event before the body accounts and releases what it holds."""
    loop = asyncio.get_running_loop()
    trail: list[str] = []

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: {}\n\n" + sse.DONE
        finally:
            trail.append("body cleanup")

    async def on_close() -> None:
        trail.append("on_close")

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message["more_body"]:
            loop.call_soon(trail.append, "written")  # as the coalescing transport's flush is scheduled

    await EventStreamResponse(body(), headers={}, on_close=on_close)({"type": "http"}, receive, send)
    assert trail == ["written", "body cleanup", "on_close"]


async def test_the_servers_body_writer_takes_the_events_between_the_first_and_the_last() -> None:
    """`BODY_WRITE`: the middle events go to the server's writer for the `send`
    the response was given; the last goes as a message (it ends the response);
    an event the writer cannot take now (False) goes as a message too."""
    written: list[bytes] = []
    refuse = {b"data: 2\n\n"}

    def write(body: bytes) -> bool:
        if body in refuse:
            return False
        written.append(body)
        return True

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def body() -> AsyncGenerator[bytes, None]:
        for e in (b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n", sse.DONE):
            yield e

    async def on_close() -> None:
        return None

    async def receive() -> dict[str, Any]:
        raise AssertionError("the flag stands in for receive()")

    def writer_for(s: Any) -> Any:
        return write if s is send else None

    scope = {"type": "http", "extensions": {CLIENT_GONE: lambda: False, BODY_WRITE: writer_for}}
    await EventStreamResponse(body(), headers={}, on_close=on_close)(scope, receive, send)
    assert written == [b"data: 1\n\n", b"data: 3\n\n"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"data: 2\n\n", True), (sse.DONE, False)]

    # A middleware's `send` (not the server's): every event goes through it.
    written.clear()
    wrapped: list[MutableMapping[str, Any]] = []

    async def middleware_send(message: MutableMapping[str, Any]) -> None:
        wrapped.append(message)

    await EventStreamResponse(body(), headers={}, on_close=on_close)(scope, receive, middleware_send)
    assert written == [] and [m.get("body") for m in wrapped[1:]] == [
        b"data: 1\n\n",
        b"data: 2\n\n",
        b"data: 3\n\n",
        sse.DONE,
    ]


async def test_a_direct_body_opens_after_the_first_message_and_counts_for_the_relay() -> None:
    """`DirectBody`: shut before the first message and after the body's end,
    ready only when the server's writer would write now; what the body writes
    that way is between its messages, and a traced relay hears the bytes."""
    from gateway.http.sse import DirectBody

    out: list[bytes] = []
    paused = {"now": False}

    def write(body: bytes) -> bool:
        if paused["now"]:
            return False
        if body:
            out.append(body)
        return True

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        if message.get("body"):
            out.append(message["body"])
        sent.append(message)

    direct = DirectBody()
    seen: list[bool] = []

    async def body() -> AsyncGenerator[bytes, None]:
        seen.append(direct.ready())  # nothing sent yet: shut
        yield b"data: head\n\n"
        seen.append(direct.ready())
        direct.write(b"data: lane-1\n\n")  # as a lane does while the body waits
        paused["now"] = True
        seen.append(direct.ready())  # the writer cannot write now: not ready
        yield b"data: 2\n\n"  # goes as a message
        paused["now"] = False
        direct.write(b"data: lane-2\n\n")
        yield sse.DONE

    told: list[tuple[int, bool]] = []

    class Relay:
        def sending(self, total: int, last: bool) -> None:
            told.append((total, last))

    async def on_close() -> None:
        return None

    async def receive() -> dict[str, Any]:
        raise AssertionError("the flag stands in for receive()")

    scope = {"type": "http", "extensions": {CLIENT_GONE: lambda: False, BODY_WRITE: lambda s: write}}
    response = EventStreamResponse(body(), headers={}, on_close=on_close, direct=direct)
    response.relay = Relay()
    await response(scope, receive, send)
    assert seen == [False, True, False]
    assert out == [b"data: head\n\n", b"data: lane-1\n\n", b"data: 2\n\n", b"data: lane-2\n\n", sse.DONE]
    assert told == [(len(out[0]), False), (sum(map(len, out)), True)]
    assert not direct.ready() and direct.sent == len(out[1]) + len(out[3])


def test_a_direct_write_the_writer_refuses_raises_instead_of_losing_the_bytes() -> None:
    from gateway.http.sse import DirectBody

    direct = DirectBody()
    with pytest.raises(RuntimeError, match="refused"):
        direct.write(b"data: x\n\n")  # shut: nothing may be written
    accept = {"now": True}
    direct.open(lambda body: accept["now"])
    direct.write(b"data: 1\n\n")
    accept["now"] = False  # e.g. the client paused reading after ready() was asked
    with pytest.raises(RuntimeError, match="refused"):
        direct.write(b"data: 2\n\n")
    assert direct.sent == len(b"data: 1\n\n")  # only what went out is counted
