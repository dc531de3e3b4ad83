"""HTTP routes of the OpenAI surface: /v1/chat/completions, /v1/completions,
/v1/models, /v1/branches/{id}/finish.

`openai_router(service, max_body_bytes=...)` builds the router around one
`OpenAIService` (a closure, no globals). Bodies are read with a size limit
(413) and validated here so every failure is an OpenAI-shaped 4xx, never
FastAPI's 422. Errors after the first streamed byte become an SSE `error`
event and the stream ends without `[DONE]` — never a silent truncation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from core.ids import ID_RE
from gateway.http.auth import bearer
from gateway.http.body import read_body
from gateway.http.docs import BEARER, body_of
from gateway.http.errors import GatewayError, InvalidRequest, NotFound
from gateway.http.sse import EventStreamResponse
from gateway.serving.openai import answers, sse
from gateway.serving.openai.convert import chat_spec, completion_spec
from gateway.serving.openai.request_fields import model_check_param, unsupported_field_message
from gateway.serving.openai.schemas import (
    AssistantMessage,
    BranchFinished,
    ChatChoice,
    ChatCompletionRequest,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
)
from gateway.serving.openai.service import (
    BranchContext,
    OpenAIService,
    Prepared,
    parse_branch_headers,
)
from gateway.serving.orchestrator import Finished
from gateway.serving.policy.tenancy import TenantContext
from gateway.serving.turn.fields import field_path
from gateway.serving.turn.identity import identity_from, opening_key

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
_JSON = "application/json"


def parse_model(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = field_path(err.get("loc", ()))
        if err.get("type") == "extra_forbidden":
            raise InvalidRequest(unsupported_field_message(loc), param=loc or None, code="unsupported_field") from exc
        msg = str(err.get("msg", "invalid request")).removeprefix("Value error, ")
        if not loc:  # a check over several fields: the one its message names first
            raise InvalidRequest(msg, param=model_check_param(msg, model.model_fields)) from exc
        raise InvalidRequest(f"{msg} (at {loc})", param=loc) from exc


def branch_from_headers(
    request: Request,
    tenant: TenantContext,
    *,
    conversation: str | None = None,
    metadata: dict[str, Any] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> BranchContext:
    """The branch contract from the headers. Without X-Branch-ID, the
    client's own conversation id names the branch, which then lives until its
    idle TTL: the API's (`conversation`: `prompt_cache_key`, a Responses
    chain), else the harness's (gateway.serving.turn.identity), else the
    opening of `messages`."""
    h = request.headers
    ident = identity_from(h, prompt_cache_key=conversation, metadata=metadata)
    session = h.get("x-session-id") or ident.session
    return parse_branch_headers(
        tenant.tenant_id,
        branch_id=h.get("x-branch-id"),
        parent_id=h.get("x-parent-branch-id"),
        session_id=session if session and ID_RE.match(session) else None,
        finished=h.get("x-branch-finished"),
        conversation=ident.conversation or (opening_key(messages) if messages else None),
        parent_conversation=ident.parent,
    )


def openai_router(service: OpenAIService, *, max_body_bytes: int) -> APIRouter:
    router = APIRouter()

    async def authenticate(request: Request) -> TenantContext:
        return await service.gate.authenticate(bearer(request.headers))

    def branch_of(request: Request, tenant: TenantContext, *, conversation: str | None = None) -> BranchContext:
        return branch_from_headers(request, tenant, conversation=conversation)

    async def start(
        request: Request, model: type[ChatCompletionRequest] | type[CompletionRequest], prefix: str
    ) -> tuple[Prepared, bool]:
        body = await read_body(request, max_body_bytes)
        req = parse_model(model, body)
        tenant = await authenticate(request)
        service.check_model(req.model)
        spec = chat_spec(req) if isinstance(req, ChatCompletionRequest) else completion_spec(req)
        branch = branch_from_headers(request, tenant, conversation=req.prompt_cache_key, messages=spec.messages)
        return await service.prepare(spec, tenant, branch, prefix), req.stream

    def headers(p: Prepared) -> dict[str, str]:
        return {"X-Request-ID": p.request_id, "X-Branch-ID": p.branch.branch_id}

    def stream_response(
        body: AsyncIterator[bytes], hdrs: dict[str, str], on_close: Callable[[], Awaitable[object]]
    ) -> Response:
        return EventStreamResponse(body, headers=hdrs, on_close=on_close)

    async def respond(p: Prepared, stream: bool, endpoint: str, chat: bool) -> Response:
        stack = AsyncExitStack()
        await stack.enter_async_context(service.admitted(p))
        if not p.plain:
            return await answers.respond(
                service,
                p,
                stream=stream,
                chat=chat,
                endpoint=endpoint,
                stack=stack,
                headers=headers(p),
                stream_response=stream_response,
            )
        if stream:
            body = _sse(service, p, endpoint, chat, stack)
            return EventStreamResponse(body, headers=headers(p), on_close=stack.aclose)
        async with stack:
            text: list[str] = []
            done: Finished | None = None
            async for ev in service.run(p):
                if isinstance(ev, str):
                    text.append(ev)
                else:
                    done = ev
        assert done is not None
        service.metrics.observe_request(p.tenant.tenant_id, endpoint, 200)
        usage = Usage.model_validate(service.usage_dict(done))
        content = "".join(text)
        choices: list[ChatChoice] | list[CompletionChoice]
        if chat:
            choices = [ChatChoice(message=AssistantMessage(content=content), finish_reason=done.finish_reason)]
        else:
            choices = [CompletionChoice(text=content, finish_reason=done.finish_reason)]
        return answers.full_answer(service, p, chat=chat, usage=usage, choices=choices, headers=headers(p))

    @router.post("/v1/chat/completions", openapi_extra=body_of(ChatCompletionRequest), tags=["openai"])
    async def chat_completions(request: Request) -> Response:
        """Chat completion (OpenAI): tools, structured outputs, `n`, logprobs; streamed or not."""
        p, stream = await start(request, ChatCompletionRequest, "chatcmpl")
        return await respond(p, stream, "chat", chat=True)

    @router.post("/v1/completions", openapi_extra=body_of(CompletionRequest), tags=["openai"])
    async def completions(request: Request) -> Response:
        """Text completion (OpenAI's legacy API): `n`, logprobs; streamed or not."""
        p, stream = await start(request, CompletionRequest, "cmpl")
        return await respond(p, stream, "completions", chat=False)

    @router.get("/v1/models", openapi_extra=BEARER, tags=["openai"])
    async def list_models(request: Request) -> Response:
        """The models this key may use."""
        tenant = await authenticate(request)
        limit = service.context_length()
        cards = [ModelCard(id=m, created=0, max_model_len=limit) for m in service.models_for(tenant)]
        return Response(ModelList(data=cards).model_dump_json(), media_type=_JSON)

    @router.get("/v1/models/{model_id:path}", openapi_extra=BEARER, tags=["openai"])
    async def get_model(model_id: str, request: Request) -> Response:
        """One model, if this key may use it (404 otherwise)."""
        tenant = await authenticate(request)
        if model_id not in service.models_for(tenant):
            raise NotFound(f"The model '{model_id}' does not exist", param="model", code="model_not_found")
        card = ModelCard(id=model_id, created=0, max_model_len=service.context_length())
        return Response(card.model_dump_json(), media_type=_JSON)

    @router.post("/v1/branches/{branch_id}/finish", openapi_extra=BEARER, tags=["branches"])
    async def finish_branch(branch_id: str, request: Request) -> Response:
        """Finish a branch now: its KV blocks lose this branch's references."""
        tenant = await authenticate(request)
        branch = parse_branch_headers(
            tenant.tenant_id, branch_id=branch_id, parent_id=None, session_id=None, finished="true"
        )
        finished = await service.directory.finish_branch(branch.key)
        return Response(BranchFinished(id=branch.branch_id, finished=finished).model_dump_json(), media_type=_JSON)

    return router


async def _sse(
    service: OpenAIService, p: Prepared, endpoint: str, chat: bool, stack: AsyncExitStack
) -> AsyncIterator[bytes]:
    enc = (sse.ChatChunkEncoder if chat else sse.CompletionChunkEncoder)(p.request_id, p.created, service.model_name)
    status = 200
    finished = False
    try:
        if chat:
            yield enc.role()  # type: ignore[union-attr]
        async for ev in service.run(p):
            if isinstance(ev, str):
                yield enc.content(ev)
            else:
                # The end of the stream in one write: finish, usage, [DONE].
                usage = enc.usage(service.usage_dict(ev)) if p.include_usage else b""
                finished = True
                yield enc.finish(ev.finish_reason) + usage + sse.DONE
        if not finished:
            yield sse.DONE
    except GatewayError as exc:
        status = exc.status
        log.warning("stream %s failed: %s", p.request_id, exc.message)
        yield sse.error_event(exc.body())
    except Exception as exc:  # reported to the client and logged, never swallowed
        status = 500
        log.exception("stream %s crashed", p.request_id)
        yield sse.error_event(GatewayError(f"internal error: {type(exc).__name__}").body())
    finally:
        service.metrics.observe_request(p.tenant.tenant_id, endpoint, status)
        await stack.aclose()
