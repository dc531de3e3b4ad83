"""The stall case of `bench gateway`: one huge prompt in flight while small
streams and a health probe run; how much latency it adds to them.

`stall_case(...)`: `streams` keep-alive connections each post a small
streaming request, wait `think_s`, repeat; one more polls `/healthz` every
10 ms. After `warm_s` + `baseline_s`, one big request goes out on its own
connection; the run ends `after_s` after it completes. A request
*overlaps* the big one when it was in flight at any moment while the big
one was. For the small streams and for /healthz:

    stall_ms = worst latency of an overlapping request - baseline p50

`big=False` is the control run: the same load with no big request, and an
"overlap" window as long as `window_s` (the big run's), so the noise of
the machine itself is measured the same way.

The client is raw asyncio + httptools (a few µs per request), so it adds
almost nothing to the core it shares with the upstream. `big_prompt(n)`
writes the big request's text: ~n bytes that tokenize like prose.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httptools


class _Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[int] | None = None
        self.status = 0
        self.size = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc or ConnectionResetError("closed"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.size += len(body)

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.status)

    async def request(self, data: bytes, timeout_s: float) -> int:
        self.done = asyncio.get_running_loop().create_future()
        self.size = 0
        self.transport.write(data)
        return await asyncio.wait_for(self.done, timeout_s)


async def _connect(host: str, port: int) -> _Client:
    _, client = await asyncio.get_running_loop().create_connection(_Client, host, port)
    return client


def post(path: str, body: bytes, api_key: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {api_key}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _summary(lat: list[tuple[float, float]], base: tuple[float, float], window: tuple[float, float]) -> dict[str, Any]:
    baseline = sorted(x for s, x in lat if base[0] <= s < base[1])
    overlap = [x for s, x in lat if s < window[1] and s + x > window[0]]
    p50 = statistics.median(baseline) if baseline else 0.0
    worst = max(overlap) if overlap else 0.0
    return {
        "baseline_p50_ms": round(1000 * p50, 2),
        "baseline_max_ms": round(1000 * baseline[-1], 2) if baseline else None,
        "overlap_requests": len(overlap),
        "overlap_worst_ms": round(1000 * worst, 2),
        "stall_ms": round(1000 * (worst - p50), 2),
    }


async def stall_case(
    host: str,
    port: int,
    *,
    small_body: bytes,
    big_body: bytes | None,
    path: str = "/v1/chat/completions",
    health_path: str | None = "/healthz",
    api_key: str = "sk-bench",
    streams: int = 32,
    think_s: float = 0.1,
    warm_s: float = 2.0,
    baseline_s: float = 3.0,
    after_s: float = 2.0,
    window_s: float = 3.0,
    big_timeout_s: float = 180.0,
) -> dict[str, Any]:
    small_lat: list[tuple[float, float]] = []
    health_lat: list[tuple[float, float]] = []
    errors = 0
    stop = False

    async def small_loop() -> None:
        nonlocal errors
        client = await _connect(host, port)
        data = post(path, small_body, api_key)
        while not stop:
            t0 = time.perf_counter()
            status = await client.request(data, 60.0)
            small_lat.append((t0, time.perf_counter() - t0))
            errors += status != 200
            await asyncio.sleep(think_s)
        client.transport.close()

    async def health_loop() -> None:
        assert health_path is not None
        client = await _connect(host, port)
        data = f"GET {health_path} HTTP/1.1\r\nhost: bench\r\n\r\n".encode()
        while not stop:
            t0 = time.perf_counter()
            await client.request(data, 60.0)
            health_lat.append((t0, time.perf_counter() - t0))
            await asyncio.sleep(0.01)
        client.transport.close()

    tasks = [asyncio.ensure_future(small_loop()) for _ in range(streams)]
    if health_path is not None:
        tasks.append(asyncio.ensure_future(health_loop()))
    await asyncio.sleep(warm_s)
    base = (time.perf_counter(), time.perf_counter() + baseline_s)
    await asyncio.sleep(baseline_s)
    big: dict[str, Any] = {}
    t0 = time.perf_counter()
    if big_body is not None:
        client = await _connect(host, port)
        try:
            big["status"] = await client.request(post(path, big_body, api_key), big_timeout_s)
            big["response_bytes"] = client.size
        except (OSError, TimeoutError) as exc:
            big["error"] = f"{type(exc).__name__}: {exc}"
        client.transport.close()
    else:
        await asyncio.sleep(window_s)
    window = (t0, time.perf_counter())
    big["latency_ms"] = round(1000 * (window[1] - window[0]), 1)
    await asyncio.sleep(after_s)
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    out: dict[str, Any] = {
        "big": big,
        "small": _summary(small_lat, base, window),
        "small_errors": errors,
        "small_requests": len(small_lat),
    }
    if health_path is not None:
        out["healthz"] = _summary(health_lat, base, window)
    out["stall_ms"] = max(out["small"]["stall_ms"], out.get("healthz", {}).get("stall_ms", 0.0))
    return out


def big_prompt(nbytes: int) -> str:
    """About `nbytes` of varied English-like text (tokenizes like prose, not like one repeated word)."""
    words = [
        "agents",
        "call",
        "tools",
        "read",
        "their",
        "results",
        "and",
        "continue",
        "the",
        "conversation",
        "with",
        "a",
        "cached",
        "prefix",
    ]
    out, size, i = [], 0, 0
    while size < nbytes:
        w = f"{words[i % len(words)]}{i % 97}"
        out.append(w)
        size += len(w) + 1
        i += 1
    return " ".join(out)
