"""Anthropic Messages stream events, encoded from the turn's `ChoiceDelta`s.

The event sequence is vLLM's (`AnthropicServingMessages.message_stream_converter`,
vLLM 0.32), produced here without a detour through chat-completion chunks:
`message_start`; per block `content_block_start`, its deltas (`thinking_delta`
then a `signature_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`; `message_delta` with the stop reason and usage
(`cache_read_input_tokens`); `message_stop`. Text that arrives while a
`tool_use` block is open is held and sent as a text block after it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.http.errors import GatewayError
from gateway.serving.anthropic.convert import error_event
from gateway.serving.jobs import Finished
from gateway.serving.turn.choices import ChoiceDelta
from gateway.serving.turn.prepare import Prepared


def _event(kind: str, body: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def stop_reason(
    finish: str | None, stop_string: str | None, *, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence): `max_tokens` always wins; a
    matched stop string wins unless the tool calls are complete (a call it cut
    short must not run); a tool call made is `tool_use`."""
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if stop_string is not None:
        return "stop_sequence", stop_string
    if finish == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


class _Blocks:
    """The content blocks of one message as they open and close."""

    def __init__(self) -> None:
        self.index = 0  # the next block's index
        self.kind: str | None = None  # the open block's type
        self.signature: str | None = None  # an open thinking block's, sent when it closes
        self.tool_id: str | None = None
        self.pending: list[str] = []  # text that came while a tool_use block was open

    def start(self, block: dict[str, Any]) -> bytes:
        self.kind = block["type"]
        self.signature = uuid.uuid4().hex if self.kind == "thinking" else None
        self.tool_id = block.get("id") if self.kind == "tool_use" else None
        return _event(
            "content_block_start", {"type": "content_block_start", "content_block": block, "index": self.index}
        )

    def delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": self.index})

    def stop(self) -> bytes:
        if self.kind is None:
            return b""
        out = b""
        if self.signature is not None:
            out = self.delta({"type": "signature_delta", "signature": self.signature})
        out += _event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.kind, self.signature, self.tool_id = None, None, None
        self.index += 1
        return out

    def stop_and_flush(self) -> bytes:
        """Close the open block; held text becomes a text block of its own."""
        held, self.pending = "".join(self.pending), []
        out = self.stop()
        if held:
            out += self.start({"type": "text", "text": ""})
            out += self.delta({"type": "text_delta", "text": held}) + self.stop()
        return out

    def open(self, kind: str) -> bytes:
        """Switch to a block of `kind` (thinking, text) unless one is open."""
        if self.kind == kind:
            return b""
        return self.stop_and_flush() + self.start({"type": kind, kind: ""})


class MessageEvents:
    """A `StreamEncoder` (gateway.serving.turn.pipeline) for /v1/messages."""

    def __init__(self, p: Prepared, model: str) -> None:
        self._id = p.request_id
        self._model = model
        self._prompt_tokens = len(p.job.prompt_token_ids)

    async def events(self, source: AsyncIterator[ChoiceDelta]) -> AsyncIterator[bytes]:
        blocks = _Blocks()
        tool_ids: dict[int, str] = {}
        tool_used = False
        last_args: list[str] = []  # the latest tool_use block's arguments (a stop string can cut only it)
        usage = {"input_tokens": self._prompt_tokens, "output_tokens": 0}
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        yield _event("message_start", {"type": "message_start", "message": message})
        finish: str | None = None
        stop_string: str | None = None
        done: Finished | None = None
        async for d in source:
            if d.finished is not None:
                done, finish, stop_string = d.finished, d.finish_reason, d.stop_string
            out = b""
            if d.reasoning:
                out += blocks.open("thinking") + blocks.delta({"type": "thinking_delta", "thinking": d.reasoning})
            content = d.content
            if content:
                if blocks.kind == "tool_use":
                    blocks.pending.append(content)
                else:
                    out += blocks.open("text") + blocks.delta({"type": "text_delta", "text": content})
            for tc in d.tool_calls:
                name = tc.function.name if tc.function else None
                args = tc.function.arguments if tc.function else None
                if tc.id is not None:
                    tool_ids[tc.index] = tc.id
                    if blocks.tool_id != tc.id and name is not None:
                        out += blocks.stop_and_flush()
                        tool_used, last_args = True, []
                        out += blocks.start({"type": "tool_use", "id": tc.id, "name": name, "input": {}})
                    call_id: str | None = tc.id
                else:
                    call_id = tool_ids.get(tc.index)
                if args and call_id is not None and blocks.tool_id == call_id:
                    last_args.append(args)
                    out += blocks.delta({"type": "input_json_delta", "partial_json": args})
            if out:
                yield out
        assert done is not None
        reason, sequence = stop_reason(
            finish or "stop", stop_string, tool_used=tool_used, tool_complete=tool_used and _is_json("".join(last_args))
        )
        final = {
            "input_tokens": max(0, done.prompt_tokens - done.cached_tokens),
            "output_tokens": done.completion_tokens,
            "cache_read_input_tokens": done.cached_tokens,
        }
        yield blocks.stop_and_flush() + _event(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": final},
        )
        yield _event("message_stop", {"type": "message_stop"})

    def failed(self, exc: GatewayError) -> bytes:
        return error_event(exc)
