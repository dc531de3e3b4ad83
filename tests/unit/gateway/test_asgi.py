"""GatewayApp's hot routes (same answers, the app's own error handlers) and
the body-size limit for the routes FastAPI parses (the admin API)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator

import httpx
import pytest
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel

from gateway.app import create_app
from gateway.http.asgi import BodySizeLimit, GatewayApp, hot_endpoint
from gateway.http.error_responses import install_error_handlers
from gateway.http.errors import InvalidRequest
from gateway.http.sse import EventStreamResponse
from gateway.settings import GatewaySettings
from testing.fake_call_tracer import FakeCallTracer
from testing.fake_worker import InProcessWorkerClient


def client_of(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


class Item(BaseModel):
    name: str


def small_app() -> tuple[GatewayApp, list[int]]:
    seen: list[int] = []
    app = GatewayApp()
    install_error_handlers(app, on_error=lambda request, status: seen.append(status))
    router = APIRouter()

    @router.post("/hot")
    async def hot(request: Request) -> Response:
        body = await request.body()
        if body == b"bad":
            raise InvalidRequest("bad body", param="body")
        if body == b"crash":
            raise RuntimeError("boom")
        return JSONResponse({"path": "hot", "body": body.decode(), "route": request.scope["route"].path})

    @router.post("/stream")
    async def stream(request: Request) -> Response:
        async def body() -> AsyncGenerator[bytes, None]:
            for chunk in (b"data: 1\n\n", b"data: 22\n\n", b"data: [DONE]\n\n"):
                yield chunk

        async def closed() -> None:
            return None

        return EventStreamResponse(body(), headers={}, on_close=closed)

    @router.post("/with-dependency")
    async def with_dependency(request: Request, limit: int = 3) -> Response:
        return JSONResponse({"limit": limit})

    @router.post("/admin/items")
    async def create_item(item: Item) -> dict[str, str]:
        return {"name": item.name}

    app.include_router(router)
    for route in router.routes:
        assert isinstance(route, APIRoute)
        app.add_hot_route(route)
    app.add_middleware(BodySizeLimit, limit=2048, prefix="/admin")
    return app, seen


def test_only_plain_request_endpoints_are_hot() -> None:
    app, _ = small_app()
    assert set(app.hot) == {"/hot", "/stream"}
    assert hot_endpoint(object()) is None


async def test_a_hot_route_answers_and_fails_as_the_app_would(caplog) -> None:
    app, seen = small_app()
    async with client_of(app) as client:
        ok = await client.post("/hot", content=b"hello")
        assert ok.json() == {"path": "hot", "body": "hello", "route": "/hot"}
        bad = await client.post("/hot", content=b"bad")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "body"
        with caplog.at_level(logging.ERROR):
            crash = await client.post("/hot", content=b"crash")
        assert crash.status_code == 500 and crash.json()["error"]["type"] == "server_error"
        assert "RuntimeError" in caplog.text
        assert (await client.get("/hot")).status_code == 405  # only POST is short-cut
        assert (await client.post("/with-dependency")).json() == {"limit": 3}
    assert seen == [400, 500, 405]


async def test_admin_bodies_over_the_limit_get_413_declared_or_streamed() -> None:
    app, _ = small_app()
    async with client_of(app) as client:
        ok = await client.post("/admin/items", json={"name": "x" * 100})
        assert ok.status_code == 200 and ok.json() == {"name": "x" * 100}
        declared = await client.post("/admin/items", json={"name": "x" * 5000})
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "payload_too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no content-length
            yield b'{"name": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}'

        streamed = await client.post("/admin/items", content=chunks())
        assert streamed.status_code == 413 and streamed.json()["error"]["type"] == "invalid_request_error"
        assert (await client.post("/hot", content=b"z" * 5000)).status_code == 200  # other paths: their own limit


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_the_gateway_serves_its_completion_routes_hot(tokenizer, path: str) -> None:
    app = create_app(GatewaySettings(model_name="demo"), tokenizer=tokenizer, worker_client=InProcessWorkerClient({}))
    assert isinstance(app, GatewayApp) and path in app.hot


async def test_a_traced_hot_route_reports_its_status_and_a_streams_first_and_last_body() -> None:
    app, _ = small_app()
    app.tracer = tracer = FakeCallTracer()
    async with client_of(app) as client:
        streamed = await client.post("/stream")
        assert streamed.text == "data: 1\n\ndata: 22\n\ndata: [DONE]\n\n"
        assert (await client.post("/hot", content=b"bad")).status_code == 400
        assert (await client.post("/hot", content=b"x", headers={"x-untraced": "1"})).status_code == 200
    assert tracer.calls == [
        # the first body message and the last, with the bytes so far
        [("open", "/stream"), ("status", 200), ("body", 9, False), ("body", 33, True), ("finish",)],
        [("open", "/hot"), ("status", 400), ("finish",)],  # one body message: no relay
    ]


async def test_a_traced_hot_call_that_raises_is_failed_and_finished() -> None:
    app = GatewayApp()  # no error handlers: the endpoint's exception leaves the app
    router = APIRouter()

    @router.post("/hot")
    async def hot(request: Request) -> Response:
        raise RuntimeError("boom")

    app.include_router(router)
    for route in router.routes:
        assert isinstance(route, APIRoute)
        app.add_hot_route(route)
    app.tracer = tracer = FakeCallTracer()
    async with client_of(app) as client:
        with pytest.raises(RuntimeError):
            await client.post("/hot")
    assert tracer.calls == [[("open", "/hot"), ("failed", "RuntimeError"), ("finish",)]]
