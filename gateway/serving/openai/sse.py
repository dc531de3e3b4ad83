"""Pure Server-Sent Events encoding of OpenAI stream chunks.

Each encoder pre-renders the constant head of its chunk JSON once per
request (id, object, created, model) and appends only the varying part, so a
token costs one C call that quotes its text. Output is byte-for-byte valid JSON
that parses into `schemas.ChatCompletionChunk` / `schemas.CompletionChunk`.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from typing import Any

from gateway.http.sse import DONE as DONE  # the event OpenAI streams end with

# ASCII-escaped: text may hold U+2028, U+0085 and the like, which JSON allows raw but
# line readers that split like str.splitlines (httpx's aiter_lines) break a line at.
# One encoder for the module: `json.dumps` with separators builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _text(text: str) -> str:
    """`text` as a JSON string (what `_dumps(text)` gives, without the encoder's dispatch)."""
    return encode_basestring_ascii(text)


def event(payload: str) -> bytes:
    """One SSE event carrying `payload` (which must not contain a newline)."""
    return b"data: " + payload.encode() + b"\n\n"


def error_event(body: dict[str, Any]) -> bytes:
    """An OpenAI-shaped error inside the stream (the SDKs raise on it)."""
    return event(_dumps(body))


class _ChunkEncoder:
    object_name = ""
    # A text chunk's choice around its quoted text (the one event of a long stream).
    content_open = ""
    content_close = ',"logprobs":null,"finish_reason":null'

    def __init__(self, chunk_id: str, created: int, model: str) -> None:
        head = _dumps({"id": chunk_id, "object": self.object_name, "created": created, "model": model})
        self._head = head[:-1] + ',"choices":['
        # `content` as two byte strings around the text: one call and two joins a token.
        self._content_before = b"data: " + (self._head + '{"index":0,' + self.content_open).encode()
        self._content_after = (self.content_close + "}]}").encode() + b"\n\n"

    def _choice(self, body: str) -> bytes:
        return event(self._head + '{"index":0,' + body + "}]}")

    def content(self, text: str) -> bytes:
        """One text delta's chunk (what `_choice` would give for it, pre-rendered around the text)."""
        return self._content_before + encode_basestring_ascii(text).encode() + self._content_after  # `_text`, inline

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The final chunk of `stream_options.include_usage`: no choices, usage set."""
        return event(self._head + '],"usage":' + _dumps(usage) + "}")


class ChatChunkEncoder(_ChunkEncoder):
    object_name = "chat.completion.chunk"
    content_open = '"delta":{"content":'
    content_close = '},"logprobs":null,"finish_reason":null'

    def role(self) -> bytes:
        return self._choice('"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null')

    def finish(self, reason: str) -> bytes:
        return self._choice('"delta":{},"logprobs":null,"finish_reason":' + _dumps(reason))


class CompletionChunkEncoder(_ChunkEncoder):
    object_name = "text_completion"
    content_open = '"text":'

    def finish(self, reason: str) -> bytes:
        return self._choice('"text":"","logprobs":null,"finish_reason":' + _dumps(reason))
