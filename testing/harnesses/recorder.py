"""A recording reverse proxy between an agent harness and the gateway.

The harness is pointed at the proxy; every exchange is forwarded unchanged
(bodies, headers, streamed chunks as they come) and kept as an `Exchange`:
the exact request the gateway got and the exact answer it gave, including
the gateway's own `X-Branch-ID` response header and the usage it reported.
The gateway keeps no per-request record with branch and status (only
counters), so the suite reads those from here and checks the totals against
the gateway's /metrics.

Raw ASGI on purpose: no framework between the bytes the harness sent and the
ones forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

# Hop-by-hop headers (RFC 9110 7.6.1) and those the forwarding recomputes.
_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "host"}
)


@dataclass
class Exchange:
    """One request as the gateway got it and its answer as the harness got it."""

    label: str  # the harness and turn the suite was running ("codex/1")
    method: str
    path: str
    query: str
    request_headers: dict[str, str]
    request_body: bytes
    status: int = 0  # 0: no answer (the proxy's `error` says why)
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""
    elapsed_s: float = 0.0
    error: str = ""  # the upstream failed or the harness hung up mid-stream


class RecordingProxy:
    """ASGI app forwarding everything to `upstream` and recording it in `exchanges`.

    `label` is read when a request arrives: the suite sets it before each turn.
    """

    def __init__(self, upstream: str, *, read_timeout_s: float = 600.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.read_timeout_s = read_timeout_s
        self.label = ""
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None

    def taken(self, label_prefix: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.label.startswith(label_prefix)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self._client is not None:
                        await self._client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        ex = Exchange(
            label=self.label,
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            request_headers={k.lower(): v for k, v in headers},
            request_body=b"".join(chunks),
        )
        with self._lock:
            self.exchanges.append(ex)
        await self._forward(ex, headers, send)

    async def _forward(self, ex: Exchange, headers: list[tuple[str, str]], send: Any) -> None:
        if self._client is None:
            timeout = httpx.Timeout(connect=10.0, read=self.read_timeout_s, write=60.0, pool=60.0)
            self._client = httpx.AsyncClient(timeout=timeout)
        start = time.monotonic()
        url = self.upstream + ex.path + (f"?{ex.query}" if ex.query else "")
        out_headers = [(k, v) for k, v in headers if k.lower() not in _HOP]
        request = self._client.build_request(ex.method, url, headers=out_headers, content=ex.request_body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            ex.error = f"upstream: {type(exc).__name__}: {exc}"
            ex.elapsed_s = time.monotonic() - start
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": ex.error.encode()})
            return
        ex.status = response.status_code
        ex.response_headers = {k.lower(): v for k, v in response.headers.items()}
        back = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items() if k not in _HOP]
        body = bytearray()
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": back})
            async for chunk in response.aiter_raw():
                body += chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except (httpx.HTTPError, OSError) as exc:
            ex.error = f"stream: {type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            ex.error = "the harness hung up mid-stream"
            raise
        finally:
            ex.response_body = bytes(body)
            ex.elapsed_s = time.monotonic() - start
            await response.aclose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_proxy(upstream: str, port: int | None = None) -> Iterator[tuple[str, RecordingProxy]]:
    """(base URL, proxy) of a recording proxy in front of `upstream`, in its own thread."""
    proxy = RecordingProxy(upstream)
    port = port or _free_port()
    config = uvicorn.Config(proxy, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", proxy
    finally:
        server.should_exit = True
        thread.join(15)
