"""The SSE encoder emits valid events that parse into the OpenAI chunk models."""

from __future__ import annotations

import json

from gateway.serving.openai import sse
from gateway.serving.openai.schemas import ChatCompletionChunk, CompletionChunk


def _payload(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    body = event[len(b"data: ") : -2]
    assert b"\n" not in body
    return json.loads(body)


def test_chat_chunks_roundtrip():
    enc = sse.ChatChunkEncoder("chatcmpl-1", 1700000000, "demo")
    role = ChatCompletionChunk.model_validate(_payload(enc.role()))
    assert role.choices[0].delta.role == "assistant" and role.choices[0].delta.content == ""
    text = ChatCompletionChunk.model_validate(_payload(enc.content('he said "hi"\n\tline ✓')))
    assert text.choices[0].delta.content == 'he said "hi"\n\tline ✓'
    assert text.id == "chatcmpl-1" and text.created == 1700000000 and text.model == "demo"
    fin = ChatCompletionChunk.model_validate(_payload(enc.finish("length")))
    assert fin.choices[0].finish_reason == "length" and fin.choices[0].delta.content is None


def test_usage_chunk_has_no_choices():
    enc = sse.ChatChunkEncoder("c", 1, "m")
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    chunk = ChatCompletionChunk.model_validate(_payload(enc.usage(usage)))
    assert chunk.choices == [] and chunk.usage is not None
    assert chunk.usage.prompt_tokens_details is not None and chunk.usage.prompt_tokens_details.cached_tokens == 4


def test_completion_chunks_roundtrip():
    enc = sse.CompletionChunkEncoder("cmpl-1", 2, "m")
    assert CompletionChunk.model_validate(_payload(enc.content("abc"))).choices[0].text == "abc"
    assert CompletionChunk.model_validate(_payload(enc.finish("stop"))).choices[0].finish_reason == "stop"


def test_model_name_with_quotes_is_escaped():
    enc = sse.ChatChunkEncoder('id"x', 1, 'my "model"')
    assert _payload(enc.content("x"))["model"] == 'my "model"'


def test_done_and_error_events():
    assert sse.DONE == b"data: [DONE]\n\n"
    err = {"error": {"message": "boom", "type": "server_error", "param": None, "code": "x"}}
    assert _payload(sse.error_event(err)) == err


def test_text_with_unicode_line_breaks_stays_on_one_line_for_splitlines_readers():
    text = "a\u2028b\u2029c\x85d\x1ce"
    event = sse.ChatChunkEncoder("c", 1, "m").content(text)
    assert len(event.decode().rstrip("\n").splitlines()) == 1
    assert ChatCompletionChunk.model_validate(_payload(event)).choices[0].delta.content == text
