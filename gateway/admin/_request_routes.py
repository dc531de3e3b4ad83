"""Admin route over the gateway's own request records (gateway.serving.turn.requestlog):
the newest requests this replica served or refused, optionally one branch's.
Operators only: the records name tenants, branches and sessions."""

# No `from __future__ import annotations`: FastAPI must resolve the local
# `Annotated` dependency aliases at definition time.

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from gateway.admin._deps import RoleDependency
from gateway.admin.auth import AdminPrincipal
from gateway.serving.turn.requestlog import RequestLog


class RequestOut(BaseModel):
    request_id: str | None
    api: str
    endpoint: str
    tenant: str | None
    branch_id: str | None
    session: str | None
    status: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    finish_reason: str | None
    start: float
    duration_s: float


class RequestsOut(BaseModel):
    requests: list[RequestOut]  # newest first


def request_routes(log: RequestLog, operator: RoleDependency) -> APIRouter:
    router = APIRouter(tags=["requests"])
    Operator = Annotated[AdminPrincipal, Depends(operator)]

    @router.get("/requests", summary="The newest requests this replica served or refused", response_model=RequestsOut)
    async def recent_requests(
        _: Operator,
        limit: Annotated[int, Query(ge=1, le=10_000, description="most records returned")] = 100,
        branch: Annotated[str | None, Query(description="only this branch's (its id, as in X-Branch-ID)")] = None,
    ) -> RequestsOut:
        records = log.recent(limit, branch=branch)
        return RequestsOut(requests=[RequestOut(**dataclasses.asdict(r)) for r in records])

    return router
