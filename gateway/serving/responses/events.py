"""Responses API output: the response object and its stream events, built
with vLLM's Responses code.

`ResponseBuilder` makes the response object (vLLM's
`ResponsesResponse.from_request`) in its `in_progress` and final states.
`EventWriter` turns parsed deltas into the typed event sequence through
vLLM's `SimpleStreamingEventProcessor` (output_item.added,
content_part.added, output_text.delta, function_call_arguments.delta, ...
.done), numbered by `sequence_number`, framed as `event: <type>` SSE. A
stream opens with `response.created` and `response.in_progress` and ends
with exactly one of `response.completed`, `response.incomplete` (the
output budget ran out) or `response.failed`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.serving.responses.convert import dumps, plain
from gateway.serving.turn.choices import ChoiceDelta, LogprobEntry

# vLLM's own additions to the response object, left out when empty.
_VLLM_ONLY = ("input_messages", "output_messages", "metrics", "kv_transfer_params", "ec_transfer_params")


def response_logprobs(entries: list[LogprobEntry]) -> list[Any]:
    from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob

    return [
        Logprob(
            token=e.token,
            bytes=e.bytes,
            logprob=e.logprob,
            top_logprobs=[LogprobTopLogprob(token=t.token, bytes=t.bytes, logprob=t.logprob) for t in e.top],
        )
        for e in entries
    ]


class ResponseBuilder:
    """The response object of one request, from vLLM's `ResponsesResponse`."""

    def __init__(self, req: Any, response_id: str, model: str, sampling: Any) -> None:
        req.request_id = response_id
        self._req = req
        self._model = model
        self._sampling = sampling  # temperature, top_p, max_tokens, penalties, logprobs: what from_request reads
        self.created = int(time.time())

    def build(self, output: list[Any], status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        from vllm.entrypoints.openai.responses.protocol import ResponsesResponse, ResponseUsage

        response = ResponsesResponse.from_request(
            self._req,
            self._sampling,
            model_name=self._model,
            created_time=self.created,
            output=output,
            # status: one of the Responses literals, carried here as a plain str.
            status=status,  # type: ignore[arg-type]
            usage=ResponseUsage.model_validate(usage) if usage is not None else None,
        )
        data: dict[str, Any] = response.model_dump(mode="json", by_alias=True)
        for key in _VLLM_ONLY:
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @staticmethod
    def usage(prompt: int, cached: int, completion: int) -> dict[str, Any]:
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }


class EventWriter:
    """SSE events of one streamed response (see the module docstring)."""

    def __init__(
        self, tools: list[Any], *, restore: Callable[[dict[str, Any]], dict[str, Any]] = lambda event: event
    ) -> None:
        from vllm.entrypoints.openai.responses.streaming_events import SimpleStreamingEventProcessor

        self._processor = SimpleStreamingEventProcessor(tools=tools)
        self._seq = 0
        self._restore = restore  # e.g. namespaced tool calls back to their namespace (responses.tools)

    @property
    def output_items(self) -> list[Any]:
        return self._processor.output_items

    def frame(self, event: dict[str, Any]) -> bytes:
        event = self._restore(event)
        event["sequence_number"] = self._seq
        self._seq += 1
        return f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode()

    def _frames(self, events: list[Any]) -> list[bytes]:
        return [self.frame(plain_event(e)) for e in events]

    def lifecycle(self, kind: str, response: dict[str, Any]) -> bytes:
        return self.frame({"type": f"response.{kind}", "response": response})

    def delta(self, d: ChoiceDelta) -> list[bytes]:
        from vllm.entrypoints.generate.base.protocol import DeltaMessage
        from vllm.entrypoints.openai.responses.streaming_events import (
            _StateType,  # noqa: PLC2701 - vLLM's own state enum for its event processor
            split_delta,
        )

        message = d.message if d.parsed else (DeltaMessage(content=d.text) if d.text else None)
        if message is None:
            return []
        lps = response_logprobs(d.logprobs) if d.logprobs else []
        out: list[bytes] = []
        proc = self._processor
        for part in split_delta(message):
            state, tool_call = proc.resolve_target_state(part)
            if state == _StateType.NONE:
                continue
            if proc.needs_transition(state, tool_call):
                out += self._frames(proc.close_current())
                out += self._frames(proc.open(state, tool_call))
            # vLLM reads the engine output only to build logprobs, which the callback here supplies.
            out += self._frames(proc.emit_delta(part, None, (lambda _output: lps) if lps else None))  # type: ignore[arg-type]
        return out

    def close(self) -> list[bytes]:
        return self._frames(self._processor.close_current())


def plain_event(event: Any) -> dict[str, Any]:
    data = event.model_dump(mode="json", by_alias=True) if hasattr(event, "model_dump") else plain(event)
    assert isinstance(data, dict)
    return data
