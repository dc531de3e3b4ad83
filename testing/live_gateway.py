"""A real gateway (`gateway.app.create_app`) on a free port in its own thread,
for tests in front of real workers (the session's vLLM cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

from gateway.app import create_app
from gateway.control.ports import Leadership
from gateway.http.server import gateway_protocol
from gateway.settings import GatewaySettings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_gateway(
    model_dir: str, worker_urls: list[str], *, leadership: Leadership | None = None, **overrides: Any
) -> Iterator[tuple[str, Any]]:
    """(base URL, app) of a gateway serving `model_dir`'s tokenizer over `worker_urls`,
    ready once every worker is healthy. `overrides` are GatewaySettings fields;
    `leadership` the replica's (none: orders carry no term, which workers that
    have seen a leader refuse; see `testing.fake_leadership`)."""
    settings = GatewaySettings(
        **{
            "model_dir": model_dir,
            "model_name": "demo-model",
            "worker_urls": tuple(worker_urls),
            "port": _free_port(),
            "heartbeat_interval_s": 0.2,
            "local_prefill_max_tokens": 64,
            **overrides,
        }
    )
    app = create_app(settings, leadership=leadership)
    # The gateway's own protocol, as `evolving-infra gateway` serves it (gathered writes, the relay lane).
    config = uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning", http=gateway_protocol())
    server = uvicorn.Server(config)
    app.state.loop = loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(server.serve()), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(url + "/readyz", timeout=2)
            if r.status_code == 200 and r.json().get("workers") == len(worker_urls):
                break
        time.sleep(0.1)
    try:
        yield url, app
    finally:
        server.should_exit = True
        thread.join(15)
