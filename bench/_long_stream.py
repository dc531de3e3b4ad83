"""The long-stream case of `bench gateway`: what relaying one token costs a proxy.

256 concurrent chat streams of 1,024 tokens each, the upstream writing one
token per stream every `interval_ms` (all streams on one shared tick, the
way a decode batch steps: `bench.gateway_upstream --token-interval-ms`),
through each proxy in turn over the same upstream. The figure is the
proxy's CPU (utime + stime from /proc, all threads, over the whole run:
connection set-up and the 256 requests' own work included, ~0.3 % of it)
per 1,000 tokens the clients received: `relay_cpu_us_per_1k_tokens`.

The load generator is this module run as a process (`python -m
bench._long_stream --port P ...`), pinned with the upstream to the load
core: uvloop, one raw `asyncio.Protocol` per stream with the `httptools`
parser (chunked decoding in C), the SSE body kept and checked once the
stream ends, so a token costs it a `data_received` and a timestamp. Every
stream must answer 200 and end with `finish_reason` "length", a usage
chunk counting all its tokens, at least one content delta and `data:
[DONE]`; a stream that does not is counted in `failed` and its first
problem kept. What the clients saw is reported with the figure: the gaps
between reads (p50 / p99 / max against the interval: steady means p99 near
the interval) and each process's CPU share (upstream + load generator on
their core well under 1: they are not what a proxy is measured by).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httptools
import orjson

from bench._wrk import process_cpu_s

KEY = "relay_cpu_us_per_1k_tokens"
TARGET_KEY, TARGET = "relay_cpu_vs_vllm_router", 2.0


@dataclass(frozen=True)
class LongStreamConfig:
    """The case's shape; `interval_ms` is per stream (25 tokens/s each at 40)."""

    streams: int = 256
    tokens: int = 1024
    interval_ms: float = 40.0

    def __post_init__(self) -> None:
        if self.streams < 1 or self.tokens < 2 or self.interval_ms <= 0:
            raise ValueError("streams >= 1, tokens >= 2 and interval_ms > 0")

    @property
    def ideal_s(self) -> float:
        """How long one stream lasts at the interval: the first token at once, then one a tick."""
        return (self.tokens - 1) * self.interval_ms / 1000

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second over all streams while they all run."""
        return self.streams * 1000 / self.interval_ms


def relay_cpu_us_per_1k(cpu_s: float, tokens: int) -> float | None:
    """Microseconds of CPU per 1,000 relayed tokens (None when none were relayed)."""
    if tokens <= 0:
        return None
    return round(cpu_s * 1e6 * 1000 / tokens, 1)


def relay_ratio(figures: dict[str, float | None], peer: str = "vllm-router") -> float | None:
    """The gateway's figure over `peer`'s (the target: at most `TARGET`)."""
    ours, theirs = figures.get("gateway"), figures.get(peer)
    return round(ours / theirs, 2) if ours is not None and theirs else None


@dataclass(frozen=True)
class StreamCheck:
    """What one finished SSE body held."""

    content_events: int  # chunks with non-empty delta content (or completion text)
    usage_tokens: int | None  # the usage chunk's completion_tokens
    finish_reason: str | None
    done: bool  # ended with `data: [DONE]`

    def problem(self, tokens: int) -> str | None:
        """None when the stream is complete: all `tokens`, a length stop and [DONE]."""
        if not self.done:
            return "no [DONE]"
        if self.usage_tokens != tokens:
            return f"usage counts {self.usage_tokens} tokens, not {tokens}"
        if self.finish_reason != "length":
            return f"finish_reason {self.finish_reason!r}"
        if not 0 < self.content_events <= tokens:
            return f"{self.content_events} content chunks for {tokens} tokens"
        return None


def check_sse(body: bytes) -> StreamCheck:
    """Parse one chat-completions SSE body (pure)."""
    content = 0
    usage = finish = None
    done = False
    for event in body.split(b"\n\n"):
        data = event.strip()
        if not data.startswith(b"data:"):
            continue
        payload = data[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        done = False  # [DONE] counts only as the last event
        chunk = orjson.loads(payload)
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") or choice.get("text")
            content += 1 if piece else 0
            finish = choice.get("finish_reason") or finish
        if chunk.get("usage"):
            usage = int(chunk["usage"]["completion_tokens"])
    return StreamCheck(content, usage, finish, done)


def quantile(sorted_values: list[float], q: float) -> float | None:
    """The `q` quantile (nearest rank) of an ascending list; None when empty."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))]


# -- the load generator (its own process) ------------------------------------------------
class _Stream(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[None], gaps: list[float]) -> None:
        self.request = request
        self.done = done
        self.gaps = gaps
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.status = 0
        self.t0 = self.last = 0.0
        self.first: float | None = None
        self.end = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t0 = self.last = time.monotonic()
        transport.write(self.request)  # type: ignore[attr-defined]  # a stream transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last = now
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionResetError("closed before the end of the response"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.end = time.monotonic()
        self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        if self.done.done():
            return
        if exc is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(exc)


def request_bytes(host: str, port: int, api_key: str, body: bytes) -> bytes:
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {api_key}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def drive(host: str, port: int, api_key: str, body: bytes, cfg: LongStreamConfig) -> dict[str, Any]:
    """Open `cfg.streams` streams at once, wait for all, check each."""
    loop = asyncio.get_running_loop()
    request = request_bytes(host, port, api_key, body)
    gaps: list[float] = []
    timeout = cfg.ideal_s * 3 + 60

    async def one() -> _Stream:
        done: asyncio.Future[None] = loop.create_future()
        transport, proto = await loop.create_connection(lambda: _Stream(request, done, gaps), host, port)
        try:
            await asyncio.wait_for(done, timeout)
        finally:
            transport.close()
        return proto

    t0 = time.monotonic()
    results = await asyncio.gather(*(one() for _ in range(cfg.streams)), return_exceptions=True)
    wall = time.monotonic() - t0
    failed, problems, tokens = 0, [], 0
    durations, ttfts = [], []
    for res in results:
        if isinstance(res, BaseException):
            failed += 1
            problems.append(f"{type(res).__name__}: {res}")
            continue
        body_bytes = b"".join(res.body)
        problem = f"HTTP {res.status}: {body_bytes[:200]!r}" if res.status != 200 else None
        check = check_sse(body_bytes) if problem is None else None
        problem = problem or (check.problem(cfg.tokens) if check else None)
        if problem is not None:
            failed += 1
            problems.append(problem)
            continue
        assert check is not None and check.usage_tokens is not None
        tokens += check.usage_tokens
        durations.append(res.end - res.t0)
        ttfts.append((res.first or res.end) - res.t0)
    gaps.sort()
    durations.sort()
    ttfts.sort()

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 2)

    return {
        "streams": cfg.streams,
        "ok": cfg.streams - failed,
        "failed": failed,
        "first_problem": problems[0] if problems else None,
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "ideal_stream_s": round(cfg.ideal_s, 2),
        "stream_s_p50": round(statistics.median(durations), 2) if durations else None,
        "stream_s_max": round(durations[-1], 2) if durations else None,
        "ttft_ms_p50": ms(quantile(ttfts, 0.5)),
        "ttft_ms_max": ms(quantile(ttfts, 1.0)),
        "gap_ms_p50": ms(quantile(gaps, 0.5)),
        "gap_ms_p99": ms(quantile(gaps, 0.99)),
        "gap_ms_max": ms(quantile(gaps, 1.0)),
        "reads": len(gaps) + len(ttfts),
    }


def chat_stream_body(model: str, messages: list[dict[str, str]], tokens: int) -> bytes:
    body = {"model": model, "messages": messages, "max_tokens": tokens, "stream": True}
    body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


# -- one case against one proxy (run from the bench's process) --------------------------------
def _machine_busy(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    total = after[0] - before[0]
    return round(1 - (after[1] - before[1]) / total, 3) if total > 0 else None


def _machine() -> tuple[float, float]:
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return sum(values) / hz, (values[3] + values[4]) / hz


def run_case(
    url: str,
    *,
    api_key: str,
    body: bytes,
    cfg: LongStreamConfig,
    pids: dict[str, int],
    cpu: str | None,
) -> dict[str, Any]:
    """The load generator against `url` (its own process, on `cpu`), with the
    CPU each of `pids` (`proxy`, `upstream`) spent meanwhile."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    argv = [sys.executable, "-m", "bench._long_stream", "--host", host, "--port", port, "--api-key", api_key]
    argv += ["--streams", str(cfg.streams), "--tokens", str(cfg.tokens), "--interval-ms", str(cfg.interval_ms)]
    if cpu is not None:
        argv = ["taskset", "-c", cpu, *argv]
    before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    machine0 = _machine()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(body, timeout=cfg.ideal_s * 4 + 120)
    wall = time.monotonic() - t0
    after = {name: process_cpu_s(pid) for name, pid in pids.items()}
    machine1 = _machine()
    if proc.returncode != 0:
        return {"error": err.decode(errors="replace")[-800:]}
    row: dict[str, Any] = json.loads(out)
    cpu_s = {name: after[name] - before[name] for name in pids}
    cpu_s["load"] = row.pop("load_cpu_s")
    row[KEY] = relay_cpu_us_per_1k(cpu_s["proxy"], row["tokens"]) if "proxy" in cpu_s else None
    row["cpu_share"] = {name: round(v / wall, 3) for name, v in cpu_s.items()}
    row["machine_busy"] = _machine_busy(machine0, machine1)
    return row


def run_targets(
    targets: dict[str, tuple[str, int, str]],
    *,
    cfg: LongStreamConfig,
    body: bytes,
    upstream_pid: int,
    cpu: str | None,
    rounds: int = 1,
    log: bool = False,
) -> dict[str, Any]:
    """The case against each `name -> (url, proxy pid, api key)` in turn,
    `rounds` times, summarized."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for _ in range(rounds):
        for name, (url, pid, key) in targets.items():
            pids = {"proxy": pid, "upstream": upstream_pid}
            row = run_case(url, api_key=key, body=body, cfg=cfg, pids=pids, cpu=cpu)
            rows[name].append(row)
            if log:
                print(json.dumps({"long_stream": name, **row}), file=sys.stderr, flush=True)
    return summarize(rows, cfg)


def summarize(rows: dict[str, list[dict[str, Any]]], cfg: LongStreamConfig) -> dict[str, Any]:
    """`relay_cpu_us_per_1k_tokens` per proxy (median over rounds; None where a
    round failed a stream) and the detail of every run."""
    figures: dict[str, float | None] = {}
    for name, runs in rows.items():
        values = [r.get(KEY) for r in runs]
        clean = all(v is not None and not r.get("failed") for r, v in zip(runs, values, strict=True))
        figures[name] = round(statistics.median(v for v in values if v is not None), 1) if clean and runs else None
    return {
        KEY: figures,
        "long_stream": {
            "streams": cfg.streams,
            "tokens_per_stream": cfg.tokens,
            "interval_ms": cfg.interval_ms,
            "tokens_per_s": round(cfg.tokens_per_s),
            "relay_cpu_vs_vllm_router": relay_ratio(figures),
            "runs": rows,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench._long_stream", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", default="sk-bench")
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--interval-ms", type=float, default=40.0)
    args = p.parse_args(argv)
    import uvloop

    cfg = LongStreamConfig(args.streams, args.tokens, args.interval_ms)
    body = sys.stdin.buffer.read()
    before = os.times()
    res = uvloop.run(drive(args.host, args.port, args.api_key, body, cfg))
    after = os.times()
    res["load_cpu_s"] = round(after.user + after.system - before.user - before.system, 3)  # the run, not the start
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
