"""Whole gateways over real HTTP on localhost in front of fake workers
(`testing.fake_worker_app`), for tests and benchmarks.

- `serve(app)`: uvicorn on a free port in this event loop (async context);
  `gateway_server=True` with the gateway's own protocol.
- `control_plane_app(...)`: the gateway as `up` serves it (store-backed gate,
  admin API, event sink) over a store the caller owns, with no planner.
- `control_plane_stack(tmp, ...)`: that app on real HTTP in its own thread,
  with fake workers, a migrated SQLite store and an operator token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import socket
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import httpx
import uvicorn

from core import Phase, Role
from gateway.admin import bootstrap_admin_token
from gateway.http.server import gateway_protocol
from gateway.serving.policy import GateConfig, StoreTenantGate
from gateway.serving.tokenize import PromptTokenizer
from gateway.settings import GatewaySettings
from gateway.store import Database, EventSink, Policy, SinkConfig, repository
from gateway.store.migrate import db_upgrade
from gateway.upstream.port import WorkerRejected
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.tiny_tokenizer import write_tiny_tokenizer
from workers.protocol import GenerateChunk, GenerateRequest


@contextlib.asynccontextmanager
async def serve(app: Any, *, gateway_server: bool = False) -> AsyncIterator[str]:
    """`gateway_server`: with the gateway's own HTTP protocol (`gateway.http.server`:
    gathered writes, the SSE body writer and its direct lane), as production serves it."""
    port = free_port()
    extra: dict[str, Any] = {"http": gateway_protocol()} if gateway_server else {}
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1, **extra)
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def control_plane_app(settings: Any, db: Any, sink: Any, gate: Any, **create_app_kwargs: Any) -> Any:
    """The gateway as `up` serves it (`gateway.compose.compose_app`: store-backed
    gate, admin API, event sink), over a store the caller owns (the bench
    needs its outage window and its usage rows). No planner: the chaos is
    the only thing that switches. The app's lifespan starts and stops the
    sink and the gate.
    """
    from gateway.admin.auth import AdminAuthenticator
    from gateway.compose import ControlPlane, compose_app
    from gateway.store import Overrides

    cp = ControlPlane(settings, db, sink, gate, AdminAuthenticator(db), Overrides())
    return compose_app(settings, control_plane=cp, planner=None, **create_app_kwargs)


MODEL = "demo"
MAX_BODY = 64 * 1024


# -- harness (shared) ------------------------------------------------------------
@dataclasses.dataclass
class ContextLimitedWorker(FakeWorker):
    """A fake worker that, like the real engine (`WorkerEngine.validate`),
    refuses prompt + max_tokens beyond its context with a non-retryable 400."""

    max_model_len: int = 1024  # reported in its stats, as the real worker does

    async def generate_stream(self, req: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        wanted = len(req.prompt_token_ids) + (1 if req.role is Role.PREFILL else req.sampling.max_tokens)
        if wanted > self.max_model_len:
            self._check_alive()
            raise WorkerRejected(
                f"prompt ({len(req.prompt_token_ids)} tokens) + max_tokens exceeds the model's "
                f"context length {self.max_model_len}",
                status=400,
                retryable=False,
            )
        async for chunk in super().generate_stream(req):
            yield chunk


class LoopThread:
    """An event loop in a daemon thread: servers live there, sync tests call in."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: every socket is held until all are bound,
    so the kernel cannot hand the same port out twice."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


async def _serve(app: Any) -> tuple[str, uvicorn.Server, asyncio.Task[None]]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, task


@dataclasses.dataclass
class ControlPlaneStack:
    url: str
    app: Any
    db: Database
    sink: EventSink
    gate: StoreTenantGate
    workers: dict[str, FakeWorker]
    operator: str
    loop: LoopThread

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    def tenant(self, name: str, policy: Policy | None = None) -> str:
        """Create a tenant (id == name) with one key; returns the key."""
        with self.db.session() as s:
            repository.create_tenant(s, name=name, tenant_id=name, policy=policy or Policy())
            _, secret = repository.create_api_key(s, tenant_id=name, pepper=self.db.pepper)
        return secret

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator}"}


@contextlib.contextmanager
def control_plane_stack(
    tmp: pathlib.Path,
    *,
    phases: tuple[Phase, ...] = (Phase.PREFILL, Phase.DECODE),
    token_delay_s: float = 0.0,
    worker_urls: tuple[str, ...] = (),
    model_dir: str | None = None,
    **overrides: Any,
) -> Iterator[ControlPlaneStack]:
    """Gateway + control plane (SQLite) + fake workers on localhost, in a loop thread.

    With `worker_urls` (and `model_dir` for the tokenizer) the gateway fronts
    those (real) workers instead of fakes.
    """
    tokenizer = PromptTokenizer.from_dir(model_dir or str(write_tiny_tokenizer(tmp / "tok")))
    url = f"sqlite:///{tmp / 'store.db'}"
    db_upgrade(url)
    db = Database(url, pepper="test-pepper")
    operator = bootstrap_admin_token(db, None)
    assert operator is not None
    sink = EventSink(db, config=SinkConfig(flush_interval_s=0.1))
    gate = StoreTenantGate(db, sink, config=GateConfig(refresh_interval_s=0.5))
    loop = LoopThread()
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []
    workers: dict[str, FakeWorker] = {}

    async def up() -> ControlPlaneStack:
        for i, phase in enumerate(() if worker_urls else phases):
            w = ContextLimitedWorker(
                f"w{i}", phase=phase, token_delay_s=token_delay_s, token_range=(10, tokenizer.vocab_size)
            )
            wurl, server, task = await _serve(create_fake_worker_app(w))
            servers.append((server, task))
            workers[wurl] = w
        fake = {"worker_urls": tuple(workers), "block_size": 16} if not worker_urls else {"worker_urls": worker_urls}
        cfg = GatewaySettings(
            **{
                "model_name": MODEL,
                "heartbeat_interval_s": 0.05,
                "local_prefill_max_tokens": 8,
                "max_body_bytes": MAX_BODY,
                **fake,
                **overrides,
            }
        )
        app = control_plane_app(cfg, db, sink, gate, tokenizer=tokenizer)
        gurl, server, task = await _serve(app)
        servers.append((server, task))
        return ControlPlaneStack(gurl, app, db, sink, gate, workers, operator, loop)

    async def down() -> None:
        for server, task in reversed(servers):
            server.should_exit = True
            await asyncio.wait([task], timeout=10)

    try:
        yield loop.run(up())
    finally:
        with contextlib.suppress(Exception):
            loop.run(down())
        loop.close()
        db.dispose()


def assert_openai_error(r: httpx.Response | Any, status: int | None = None) -> dict[str, Any]:
    if status is not None:
        assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    assert set(err) >= {"message", "type", "param", "code"}
    return err


# -- fixtures -----------------------------------------------------------------------
