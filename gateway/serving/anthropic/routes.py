"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.

The same generation path as the OpenAI routes (tokenize once, branch
contract, tenant admission, P/D orchestration, vLLM's parser); the request
and the answer go through vLLM's Anthropic converters (convert.py).

- Auth: the tenant key as `x-api-key` (Anthropic's header) or
  `Authorization: Bearer` (what the Anthropic SDK 2.x sends).
- Branch: `X-Branch-ID` when sent; else Claude Code's session
  (`X-Claude-Code-Session-Id`, or the session in `metadata.user_id`); else
  the opening of the conversation, so a harness resending its history
  stays on one branch.
- Streams are primed (a refused request is a 4xx, not an `error` event)
  and end with `message_delta` (stop_reason, usage with
  `cache_read_input_tokens`) and `message_stop`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.http.auth import api_key
from gateway.http.body import json_object, read_body
from gateway.http.docs import ANTHROPIC, body_of
from gateway.http.errors import GatewayError
from gateway.http.sse import EventStreamResponse
from gateway.serving.anthropic import convert
from gateway.serving.openai.answers import ChunkWriter, _primed, collect
from gateway.serving.openai.routes import branch_from_headers
from gateway.serving.openai.service import OpenAIService, Prepared
from gateway.serving.orchestrator import Finished
from gateway.serving.turn.choices import run_choices
from gateway.serving.turn.relay import deltas

log = logging.getLogger(__name__)


def _models() -> tuple[Any, Any]:
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest

    return AnthropicMessagesRequest, AnthropicCountTokensRequest


def anthropic_router(service: OpenAIService, *, max_body_bytes: int) -> APIRouter:
    router = APIRouter()
    messages_model, count_model = _models()
    reasoning = service.parsing.reasoning

    def text_tokens(text: str) -> int:
        return len(service.tokenizer.encode_text(text, add_special_tokens=False))

    @router.post(
        "/v1/messages",
        openapi_extra=body_of(messages_model, security=ANTHROPIC, exclude=convert.REFUSED),
        tags=["anthropic"],
    )
    async def create_message(request: Request) -> Response:
        """Create a message (Anthropic Messages API): system, tools, tool_use / tool_result,
        streamed as Anthropic events or not."""
        try:
            return await _create(request)
        except GatewayError as exc:
            service.metrics.observe_request("-", "messages", exc.status)
            return convert.error_response(exc)

    async def _create(request: Request) -> Response:
        data = json_object(await read_body(request, max_body_bytes))
        req = convert.parse_request(data, reasoning=reasoning, text_tokens=text_tokens)
        tenant = await service.gate.authenticate(api_key(request.headers))
        service.check_model(req.model)
        spec = convert.turn_spec(req)
        branch = branch_from_headers(request, tenant, metadata=req.metadata, messages=spec.messages)
        p = await service.prepare(spec, tenant, branch, "msg")
        stack = AsyncExitStack()
        await stack.enter_async_context(service.admitted(p))
        headers = {"request-id": p.request_id, "X-Branch-ID": p.branch.branch_id}
        if not req.stream:
            async with stack:
                results = await collect(service, p)
            service.metrics.observe_request(tenant.tenant_id, "messages", 200)
            return JSONResponse(convert.full_message(p.request_id, service.model_name, results[0]), headers=headers)
        events = run_choices(service, p, streaming=True)
        try:
            first, events = await _primed(events)
        except BaseException:
            await events.aclose()  # type: ignore[attr-defined]
            await stack.aclose()
            raise
        body = _stream(service, p, first, events, stack)
        return EventStreamResponse(body, headers=headers, on_close=stack.aclose)

    @router.post(
        "/v1/messages/count_tokens",
        openapi_extra=body_of(count_model, security=ANTHROPIC, exclude=convert.REFUSED),
        tags=["anthropic"],
    )
    async def count_tokens(request: Request) -> Response:
        """The prompt tokens a Messages request would use (rendered with the chat template)."""
        try:
            data = json_object(await read_body(request, max_body_bytes))
            req = convert.parse_request(data, count_tokens=True, reasoning=reasoning, text_tokens=text_tokens)
            await service.gate.authenticate(api_key(request.headers))
            service.check_model(req.model)
            spec = convert.count_tokens_spec(req)
            tokens = service.tokenizer.encode_chat(
                spec.messages or [], tools=spec.tools, template_kwargs=spec.template_kwargs
            )
        except GatewayError as exc:
            return convert.error_response(exc)
        return JSONResponse({"input_tokens": len(tokens)})

    return router


async def _stream(
    service: OpenAIService, p: Prepared, first: Any, events: AsyncIterator[Any], stack: AsyncExitStack
) -> AsyncIterator[bytes]:
    status = 200
    try:
        async for event in convert.stream_events(_chat_chunks(service, p, first, events)):
            yield event
    except Exception as exc:  # reported to the client and logged, never swallowed
        status = 500
        log.exception("message stream %s crashed", p.request_id)
        yield convert.error_event(GatewayError(f"internal error: {type(exc).__name__}"))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        service.metrics.observe_request(p.tenant.tenant_id, "messages", status)
        await stack.aclose()


async def _chat_chunks(
    service: OpenAIService, p: Prepared, first: Any, events: AsyncIterator[Any]
) -> AsyncIterator[bytes]:
    """The chat-completion chunks vLLM's Anthropic converter reads: a role
    chunk with the prompt's size, the deltas, the finish chunk, the usage chunk."""
    writer = ChunkWriter(p, service.model_name, chat=True)
    prompt = len(p.job.prompt_token_ids)
    yield writer.role(0, {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt})
    done: Finished | None = None
    async with aclosing(deltas(first, events)) as relayed:
        async for delta in relayed:
            if delta.finished is not None:
                done = delta.finished
            chunk = writer.delta(delta)
            if chunk is not None:
                yield chunk
    assert done is not None
    yield writer.usage(convert.chat_usage(done))
    yield b"data: [DONE]\n\n"
