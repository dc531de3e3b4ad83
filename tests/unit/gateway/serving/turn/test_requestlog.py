"""The gateway's own request records: the ring (pure), one record per request
through the app (answered, streamed and refused, on every API), and the
operators' route that reads them."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI

from gateway.admin._request_routes import request_routes
from gateway.admin.auth import AdminPrincipal
from gateway.app import create_app
from gateway.http import errors
from gateway.http.error_responses import install_error_handlers
from gateway.serving.turn.requestlog import RequestLog, RequestRecord
from gateway.settings import GatewaySettings
from testing.fake_worker import FakeWorker, InProcessWorkerClient


def record(n: int, branch: str = "b", status: int = 200) -> RequestRecord:
    return RequestRecord(f"r{n}", "openai", "chat", "t", branch, None, status, 5, 0, 2, "stop", float(n), 0.1)


def test_the_ring_keeps_the_newest_and_reads_newest_first() -> None:
    log = RequestLog(3)
    for n in range(5):
        log.add(record(n, branch="even" if n % 2 == 0 else "odd"))
    assert len(log) == 3
    assert [r.request_id for r in log.recent(10)] == ["r4", "r3", "r2"]
    assert [r.request_id for r in log.recent(1)] == ["r4"]
    assert [r.request_id for r in log.recent(10, branch="even")] == ["r4", "r2"]
    assert log.recent(10, branch="none") == []
    with pytest.raises(ValueError, match="holds at least one record"):
        RequestLog(0)


@pytest.fixture
async def gateway(tokenizer):
    worker = FakeWorker("w0", token_range=(10, tokenizer.vocab_size), block_size=16)
    settings = GatewaySettings(model_name="demo", worker_urls=("http://w0",), default_max_tokens=6)
    app = create_app(settings, tokenizer=tokenizer, worker_client=InProcessWorkerClient({"http://w0": worker}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        yield client, app.state.runtime.service.requests


async def test_every_request_leaves_one_record(gateway) -> None:
    client, log = gateway
    chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = await client.post("/v1/chat/completions", json=chat, headers={"X-Branch-ID": "agent-1"})
    assert r.status_code == 200, r.text
    streamed = await client.post(
        "/v1/chat/completions", json={**chat, "stream": True}, headers={"X-Branch-ID": "agent-1"}
    )
    assert streamed.text.endswith("data: [DONE]\n\n")
    assert (await client.post("/v1/chat/completions", json={**chat, "bogus": 1})).status_code == 400
    msg = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert (await client.post("/v1/messages", json=msg)).status_code == 200
    assert (await client.post("/v1/messages", json={**msg, "model": "nope"})).status_code == 404
    assert (
        await client.post("/v1/responses", json={"model": "demo", "input": "hi", "max_output_tokens": 4})
    ).status_code == 200
    count = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/messages/count_tokens", json=count)).json()["input_tokens"] > 0
    assert (await client.post("/v1/messages/count_tokens", json={**count, "model": "nope"})).status_code == 404
    assert (await client.get("/v1/models")).status_code == 200
    assert (await client.get("/v1/models/demo")).status_code == 200
    assert (await client.get("/v1/models/nope")).status_code == 404
    records = log.recent(100)
    assert [(r.api, r.endpoint, r.status) for r in reversed(records)] == [
        ("openai", "chat", 200),
        ("openai", "chat", 200),
        ("openai", "chat", 400),
        ("anthropic", "messages", 200),
        ("anthropic", "messages", 404),
        ("responses", "responses", 200),
        ("anthropic", "count_tokens", 200),
        ("anthropic", "count_tokens", 404),
        ("openai", "models", 200),
        ("openai", "models", 200),
        ("openai", "models", 404),
    ]
    records = records[5:]  # the generation requests, newest first
    first, second = log.recent(2, branch="agent-1")[::-1]
    assert first.request_id == r.headers["x-request-id"] and second.request_id == streamed.headers["x-request-id"]
    for ok in (first, second):
        assert (
            ok.tenant and ok.prompt_tokens > 0 and 1 <= ok.output_tokens <= 4 and ok.finish_reason in ("stop", "length")
        )
        assert ok.duration_s > 0
    assert first.output_tokens == json.loads(r.text)["usage"]["completion_tokens"]
    refused = records[3]  # the chat request with an unknown field: refused before it had an id or a tenant
    assert (refused.request_id, refused.tenant, refused.output_tokens) == (None, None, 0)
    assert records[1].tenant is not None  # the unknown model: refused after the key was read


async def test_operators_read_the_records(tokenizer) -> None:
    log = RequestLog(10)
    for n in range(4):
        log.add(record(n, branch="a" if n < 2 else "b"))
    role = {"name": "operator"}

    async def operator() -> AdminPrincipal:
        if role["name"] != "operator":
            raise errors.PermissionDenied("This action needs an operator token; yours is a viewer token.")
        return AdminPrincipal("t1", "ops", "operator")

    app = FastAPI()
    install_error_handlers(app)
    app.include_router(request_routes(log, operator), prefix="/admin")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        body = (await client.get("/admin/requests", params={"limit": 3})).json()
        assert [r["request_id"] for r in body["requests"]] == ["r3", "r2", "r1"]
        body = (await client.get("/admin/requests", params={"branch": "a"})).json()
        assert [r["request_id"] for r in body["requests"]] == ["r1", "r0"]
        assert body["requests"][0]["status"] == 200 and body["requests"][0]["output_tokens"] == 2
        assert (await client.get("/admin/requests", params={"limit": 0})).status_code == 400
        role["name"] = "viewer"
        assert (await client.get("/admin/requests")).status_code == 403
