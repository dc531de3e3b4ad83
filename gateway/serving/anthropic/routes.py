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
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.http.auth import api_key
from gateway.http.body import json_object, read_body
from gateway.http.docs import ANTHROPIC, body_of
from gateway.http.headers import header_dict
from gateway.serving.anthropic import convert
from gateway.serving.anthropic.events import MessageEvents
from gateway.serving.turn.branch import branch_from_headers
from gateway.serving.turn.pipeline import Turn
from gateway.serving.turn.service import TurnService

log = logging.getLogger(__name__)


def _models() -> tuple[Any, Any]:
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest

    return AnthropicMessagesRequest, AnthropicCountTokensRequest


def anthropic_router(service: TurnService, *, max_body_bytes: int) -> APIRouter:
    router = APIRouter()
    messages_model, count_model = _models()
    reasoning = service.model.parsing.reasoning

    def text_tokens(text: str) -> int:
        return len(service.tokenizer.encode_text(text, add_special_tokens=False))

    async def answer(turn: Turn, request: Request) -> Response:
        data = json_object(await read_body(request, max_body_bytes))
        req = convert.parse_request(data, reasoning=reasoning, text_tokens=text_tokens)
        headers = header_dict(request.scope["headers"])
        tenant = await turn.authenticate(api_key(headers))
        service.check_model(req.model)
        spec = convert.turn_spec(req)
        branch = branch_from_headers(headers, tenant.tenant_id, metadata=req.metadata, messages=spec.messages)
        p = await turn.prepare(spec, tenant, branch, "msg")
        headers = {"request-id": p.request_id, "X-Branch-ID": p.branch.branch_id}
        if req.stream:
            return await turn.stream(MessageEvents(p, service.model_name), headers=headers)
        results = await turn.collect()
        return JSONResponse(convert.full_message(p.request_id, service.model_name, results[0]), headers=headers)

    @router.post(
        "/v1/messages",
        openapi_extra=body_of(messages_model, security=ANTHROPIC, exclude=convert.REFUSED),
        tags=["anthropic"],
    )
    async def create_message(request: Request) -> Response:
        """Create a message (Anthropic Messages API): system, tools, tool_use / tool_result,
        streamed as Anthropic events or not."""
        return await service.serve(
            "anthropic", "messages", lambda turn: answer(turn, request), error_answer=convert.error_response
        )

    @router.post(
        "/v1/messages/count_tokens",
        openapi_extra=body_of(count_model, security=ANTHROPIC, exclude=convert.REFUSED),
        tags=["anthropic"],
    )
    async def count_tokens(request: Request) -> Response:
        """The prompt tokens a Messages request would use (rendered with the chat template)."""
        return await service.serve(
            "anthropic", "count_tokens", lambda turn: count(turn, request), error_answer=convert.error_response
        )

    async def count(turn: Turn, request: Request) -> Response:
        data = json_object(await read_body(request, max_body_bytes))
        req = convert.parse_request(data, count_tokens=True, reasoning=reasoning, text_tokens=text_tokens)
        await turn.authenticate(api_key(header_dict(request.scope["headers"])))
        service.check_model(req.model)
        spec = convert.count_tokens_spec(req)
        tokens = service.tokenizer.encode_chat(
            spec.messages or [], tools=spec.tools, template_kwargs=spec.template_kwargs
        )
        return JSONResponse({"input_tokens": len(tokens)})

    return router
