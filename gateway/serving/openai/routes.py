"""HTTP routes of the OpenAI surface: /v1/chat/completions, /v1/completions,
/v1/models, /v1/branches/{id}/finish.

`openai_router(service, max_body_bytes=...)` builds the router around the
`TurnService` (a closure, no globals); each generation request is one
`Turn` (gateway.serving.turn.pipeline) with this API's encoders. Bodies are read with a size limit
(413) and validated here so every failure is an OpenAI-shaped 4xx, never
FastAPI's 422. Errors after the first streamed byte become an SSE `error`
event and the stream ends without `[DONE]` — never a silent truncation.
"""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from gateway.http.auth import bearer
from gateway.http.body import read_body
from gateway.http.docs import BEARER, body_of
from gateway.http.errors import InvalidRequest, NotFound
from gateway.http.headers import header_dict
from gateway.serving.openai.answers import chat_choices, completion_choices, full_answer
from gateway.serving.openai.convert import chat_spec, completion_spec
from gateway.serving.openai.encoders import ChoiceChunks, PlainChunks
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
from gateway.serving.turn.accounting import usage_dict
from gateway.serving.turn.branch import branch_from_headers, parse_branch_headers
from gateway.serving.turn.fields import field_path
from gateway.serving.turn.pipeline import Turn
from gateway.serving.turn.service import TurnService

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


async def models_answer(service: TurnService, turn: Turn, request: Request, model_id: str | None) -> Response:
    """The models the turn's key may use (`model_id` None) or one model's card (404 if not one of them)."""
    tenant = await turn.authenticate(bearer(header_dict(request.scope["headers"])))
    limit = service.context_length()
    if model_id is None:
        cards = [ModelCard(id=m, created=0, max_model_len=limit) for m in service.models_for(tenant)]
        return Response(ModelList(data=cards).model_dump_json(), media_type=_JSON)
    if model_id not in service.models_for(tenant):
        raise NotFound(f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return Response(ModelCard(id=model_id, created=0, max_model_len=limit).model_dump_json(), media_type=_JSON)


def openai_router(service: TurnService, *, max_body_bytes: int) -> APIRouter:
    router = APIRouter()

    async def answer(
        turn: Turn, request: Request, model: type[ChatCompletionRequest] | type[CompletionRequest]
    ) -> Response:
        chat = model is ChatCompletionRequest
        req = parse_model(model, await read_body(request, max_body_bytes))
        sent = header_dict(request.scope["headers"])
        tenant = await turn.authenticate(bearer(sent))
        service.check_model(req.model)
        spec = chat_spec(req) if isinstance(req, ChatCompletionRequest) else completion_spec(req)
        branch = branch_from_headers(sent, tenant.tenant_id, conversation=req.prompt_cache_key, messages=spec.messages)
        p = await turn.prepare(spec, tenant, branch, "chatcmpl" if chat else "cmpl")
        headers = {"X-Request-ID": p.request_id, "X-Branch-ID": p.branch.branch_id}
        if req.stream and p.plain:
            return await turn.stream_plain(PlainChunks(p, service.model_name, chat=chat), headers=headers)
        if req.stream:
            return await turn.stream(ChoiceChunks(p, service.model_name, chat=chat), headers=headers)
        choices: list[ChatChoice] | list[CompletionChoice]
        if p.plain:
            content, done = await turn.collect_text()
            usage = Usage.model_validate(usage_dict([done]))
            if chat:
                choices = [ChatChoice(message=AssistantMessage(content=content), finish_reason=done.finish_reason)]
            else:
                choices = [CompletionChoice(text=content, finish_reason=done.finish_reason)]
        else:
            results = await turn.collect()
            usage = Usage.model_validate(usage_dict([r.finished for r in results]))
            choices = chat_choices(p, results) if chat else completion_choices(p, results)
        return full_answer(p, service.model_name, chat=chat, usage=usage, choices=choices, headers=headers)

    @router.post("/v1/chat/completions", openapi_extra=body_of(ChatCompletionRequest), tags=["openai"])
    async def chat_completions(request: Request) -> Response:
        """Chat completion (OpenAI): tools, structured outputs, `n`, logprobs; streamed or not."""
        return await service.serve("openai", "chat", lambda turn: answer(turn, request, ChatCompletionRequest))

    @router.post("/v1/completions", openapi_extra=body_of(CompletionRequest), tags=["openai"])
    async def completions(request: Request) -> Response:
        """Text completion (OpenAI's legacy API): `n`, logprobs; streamed or not."""
        return await service.serve("openai", "completions", lambda turn: answer(turn, request, CompletionRequest))

    @router.get("/v1/models", openapi_extra=BEARER, tags=["openai"])
    async def list_models(request: Request) -> Response:
        """The models this key may use."""
        return await service.serve("openai", "models", lambda turn: models_answer(service, turn, request, None))

    @router.get("/v1/models/{model_id:path}", openapi_extra=BEARER, tags=["openai"])
    async def get_model(model_id: str, request: Request) -> Response:
        """One model, if this key may use it (404 otherwise)."""
        return await service.serve("openai", "models", lambda turn: models_answer(service, turn, request, model_id))

    @router.post("/v1/branches/{branch_id}/finish", openapi_extra=BEARER, tags=["branches"])
    async def finish_branch(branch_id: str, request: Request) -> Response:
        """Finish a branch now: its KV blocks lose this branch's references."""
        tenant = await service.authenticate(bearer(request.headers))
        branch = parse_branch_headers(
            tenant.tenant_id, branch_id=branch_id, parent_id=None, session_id=None, finished="true"
        )
        finished = await service.finish_branch(branch.key)
        return Response(BranchFinished(id=branch.branch_id, finished=finished).model_dump_json(), media_type=_JSON)

    return router
