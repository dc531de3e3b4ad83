"""The OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

One request is one generation turn through the same path as chat
completions (tokenize once, branch contract, tenant admission, the P/D
orchestrator, vLLM's parser). What is particular to this API:

- the conversation: `instructions` (never carried over), the input items,
  and the stored turns of a `previous_response_id` chain (store.py);
- the branch: `X-Branch-ID` when sent, else the client's conversation:
  `prompt_cache_key`, the branch of the turn it continues, or the opening
  of the conversation (its messages up to the first user message), so an
  agent loop that resends its whole history stays on one branch;
- the answer: a response object, or its event stream (events.py); a
  stream is primed, so a request the model refuses is a 400, not a
  `response.failed` inside a 200.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from core import FinishReason
from gateway.http.auth import bearer
from gateway.http.body import json_object, read_body
from gateway.http.docs import BEARER, body_of
from gateway.http.errors import GatewayError, NotFound
from gateway.http.headers import header_dict
from gateway.serving.jobs import Finished
from gateway.serving.responses import convert
from gateway.serving.responses.events import EventWriter, ResponseBuilder, response_logprobs
from gateway.serving.responses.store import ResponseStore, StoredTurn, conversation
from gateway.serving.responses.tools import ToolSurface, offered_tools
from gateway.serving.turn.branch import branch_from_headers
from gateway.serving.turn.identity import opening_key
from gateway.serving.turn.pipeline import Turn
from gateway.serving.turn.prepare import Prepared
from gateway.serving.turn.service import TurnService

log = logging.getLogger(__name__)
_JSON = "application/json"


def _doc_model() -> Any:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return ResponsesRequest


def responses_router(service: TurnService, store: ResponseStore, *, max_body_bytes: int) -> APIRouter:
    router = APIRouter()

    async def answer(turn: Turn, request: Request) -> Response:
        data, surface = offered_tools(json_object(await read_body(request, max_body_bytes)))
        req = convert.parse_request(data)
        headers = header_dict(request.scope["headers"])
        tenant = await turn.authenticate(bearer(headers))
        service.check_model(req.model)
        history: list[dict[str, Any]] = []
        key: str | None = req.prompt_cache_key
        if req.previous_response_id:
            chain = await conversation(store, tenant.tenant_id, req.previous_response_id)
            if chain is None:
                raise NotFound(
                    f"Previous response with id '{req.previous_response_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = [m for turn in chain for m in turn.messages]
            key = key or chain[-1].branch_id
        spec, added = convert.turn_spec(req, history)
        key = key or opening_key(spec.messages or [])
        branch = branch_from_headers(headers, tenant.tenant_id, conversation=key)
        p = await turn.prepare(spec, tenant, branch, "resp")
        builder = ResponseBuilder(req, p.request_id, service.model_name, p.job.sampling)
        out = _Answer(store, req, p, added, key, builder, surface)
        headers = {"X-Request-ID": p.request_id, "X-Branch-ID": p.branch.branch_id}
        if surface.not_offered:
            headers["X-Tools-Not-Offered"] = ",".join(surface.not_offered)
        if req.stream:
            return await turn.stream(out, headers=headers)
        results = await turn.collect()
        response = await out.finish_full(results[0])
        return Response(convert.dumps(response), media_type=_JSON, headers=headers)

    @router.post(
        "/v1/responses",
        openapi_extra=body_of(_doc_model(), exclude=convert.REFUSED),
        tags=["openai"],
    )
    async def create_response(request: Request) -> Response:
        """Create a model response (OpenAI Responses API): function tools, `text.format`,
        `previous_response_id`, `store`; streamed as typed events or not."""
        return await service.serve("responses", "responses", lambda turn: answer(turn, request))

    @router.get("/v1/responses/{response_id}", openapi_extra=BEARER, tags=["openai"])
    async def get_response(response_id: str, request: Request) -> Response:
        """A stored response (within the retention, see docs/api.md)."""
        tenant = await service.authenticate(bearer(request.headers))
        turn = await store.get(tenant.tenant_id, response_id)
        if turn is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        return Response(convert.dumps(turn.response), media_type=_JSON)

    @router.delete("/v1/responses/{response_id}", openapi_extra=BEARER, tags=["openai"])
    async def delete_response(response_id: str, request: Request) -> Response:
        """Forget a stored response: it can no longer be continued."""
        tenant = await service.authenticate(bearer(request.headers))
        if not await store.delete(tenant.tenant_id, response_id):
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        body = {"id": response_id, "object": "response.deleted", "deleted": True}
        return Response(convert.dumps(body), media_type=_JSON)

    return router


class _Answer:
    """One request's answer: its output, the stored turn, the stream's events."""

    def __init__(
        self,
        store: ResponseStore,
        req: Any,
        p: Prepared,
        added: list[dict[str, Any]],
        key: str,
        builder: ResponseBuilder,
        surface: ToolSurface,
    ) -> None:
        self._store, self._req, self._p, self._added, self._key, self._builder = store, req, p, added, key, builder
        self._surface = surface
        self._writer = EventWriter(req.tools, restore=surface.restore)

    def _usage(self, done: Finished) -> dict[str, Any]:
        return ResponseBuilder.usage(done.prompt_tokens, done.cached_tokens, done.completion_tokens)

    @staticmethod
    def _status(done: Finished) -> str:
        return "incomplete" if done.finish_reason is FinishReason.LENGTH else "completed"

    async def _save(self, output: list[Any], response: dict[str, Any]) -> None:
        if self._req.store is False:
            return
        text, calls = convert.output_calls(output)
        turn = StoredTurn(
            response_id=self._p.request_id,
            tenant_id=self._p.tenant.tenant_id,
            previous_id=self._req.previous_response_id,
            messages=[*self._added, convert.output_message(text, calls)],
            branch_id=self._key,
            response=response,
            created=float(self._builder.created),
        )
        try:
            await self._store.put(turn)
        except (RedisError, OSError):  # the answer is still good; only its continuation is lost, and logged
            log.exception("response %s could not be stored", self._p.request_id)

    async def finish_full(self, result: Any) -> dict[str, Any]:
        from vllm.entrypoints.openai.responses.utils import build_response_output_items

        output = build_response_output_items(
            result.reasoning,
            result.content,
            result.tool_calls,
            logprobs=response_logprobs(result.logprobs) if self._p.logprobs is not None else None,
            tools=self._req.tools,
        )
        response = self._surface.restore(
            self._builder.build(output, self._status(result.finished), self._usage(result.finished))
        )
        await self._save(output, response)
        return response

    async def events(self, source: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        """The stream's events (gateway.serving.turn.pipeline.StreamEncoder)."""
        writer = self._writer
        initial = self._builder.build([], "in_progress")
        yield writer.lifecycle("created", initial)
        yield writer.lifecycle("in_progress", initial)
        done: Finished | None = None
        async for delta in source:
            if delta.finished is not None:
                done = delta.finished
            for frame in writer.delta(delta):
                yield frame
        for frame in writer.close():
            yield frame
        assert done is not None
        state = self._status(done)
        response = self._surface.restore(self._builder.build(writer.output_items, state, self._usage(done)))
        await self._save(writer.output_items, response)
        yield writer.lifecycle(state, response)

    def failed(self, exc: GatewayError) -> bytes:
        """`response.failed` with what was streamed so far and the error."""
        failed = self._builder.build(self._writer.output_items, "failed")
        failed["error"] = {"code": exc.code or exc.type, "message": exc.message}
        return self._writer.lifecycle("failed", failed)
