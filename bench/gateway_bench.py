"""`evolving-infra bench gateway`: what the gateway itself costs per request.

One local upstream streams a fixed number of tokens (no model: this measures
the gateway, not inference). It speaks both OpenAI SSE (for the direct and
LiteLLM paths) and the worker protocol (for this gateway, which is pointed
at it as its only decode worker), with the same token cadence. Three paths,
each at increasing concurrency, streaming chat completions:

    direct   client -> upstream /v1/chat/completions
    gateway  client -> evolving-infra gateway -> upstream /internal/generate
    litellm  client -> LiteLLM -> upstream /v1/chat/completions

Every server runs in its own process. Overhead = path latency - direct
latency (end to end, concurrency 1, p50 and p99). max_rps = best completed
requests/s over the concurrency levels. Prints one JSON object.

LiteLLM: the real proxy (`litellm --config`) when its extras are importable;
otherwise a minimal proxy over `litellm.acompletion` (the SDK path the proxy
itself wraps, without its auth/logging hooks, so a lower bound on its cost).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
from fastapi import Request  # module level: the shim's handler annotation resolves here

MODEL = "bench"
PAYLOAD_MESSAGES = [
    {"role": "system", "content": "You are a benchmark."},
    {"role": "user", "content": "Agents call tools, read their results and continue."},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- server processes (re-entered through --serve) ------------------------------
def serve_upstream(port: int, tokenizer_dir: str, delay_s: float) -> None:
    import uvicorn

    from gateway.serving.tokenize import PromptTokenizer
    from testing.fake_worker import FakeWorker
    from testing.fake_worker_app import create_fake_worker_app

    vocab = PromptTokenizer.from_dir(tokenizer_dir).vocab_size
    worker = FakeWorker("up0", token_delay_s=delay_s, token_range=(10, vocab), block_size=32)
    app = create_fake_worker_app(worker, openai_model=MODEL)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def serve_gateway(port: int, tokenizer_dir: str, upstream: str) -> None:
    import uvicorn

    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    settings = GatewaySettings(
        model_dir=tokenizer_dir, model_name=MODEL, worker_urls=(upstream,), port=port, heartbeat_interval_s=1.0
    )
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="error", access_log=False)


def serve_litellm_shim(port: int, upstream: str) -> None:
    """A minimal OpenAI proxy over litellm.acompletion (used when the proxy extras are missing)."""
    import litellm
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    litellm.telemetry = False
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        kwargs = dict(
            model=f"openai/{body['model']}",
            api_base=f"{upstream}/v1",
            api_key="sk-bench",
            messages=body["messages"],
            max_tokens=body.get("max_tokens"),
        )
        if not body.get("stream"):
            return JSONResponse((await litellm.acompletion(**kwargs)).model_dump())
        stream = await litellm.acompletion(stream=True, **kwargs)

        async def sse():
            async for chunk in stream:
                yield f"data: {chunk.model_dump_json()}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def litellm_proxy_available() -> bool:
    probe = [sys.executable, "-c", "import litellm.proxy.proxy_server"]
    return subprocess.run(probe, capture_output=True, timeout=180).returncode == 0


@contextlib.contextmanager
def process(argv: list[str], url: str, log: pathlib.Path, timeout_s: float = 180.0) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[:4]} exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url, timeout=1.0).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[:4]} not ready after {timeout_s}s")
            time.sleep(0.25)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- load generation -------------------------------------------------------------
async def one_request(client: httpx.AsyncClient, url: str, tokens: int) -> float:
    body = {"model": MODEL, "messages": PAYLOAD_MESSAGES, "max_tokens": tokens, "stream": True}
    t0 = time.perf_counter()
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        done = False
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                done = True
        if not done:
            raise RuntimeError(f"{url}: stream ended without [DONE]")
    return time.perf_counter() - t0


async def run_level(url: str, concurrency: int, requests: int, tokens: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:
        for _ in range(min(concurrency, 8)):  # warm connections and caches
            await one_request(client, url, tokens)
        latencies: list[float] = []
        remaining = requests

        async def loop() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                latencies.append(await one_request(client, url, tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def measure(url: str, levels: list[int], requests: int, tokens: int) -> dict[str, object]:
    by_level = [asyncio.run(run_level(url, c, requests if c > 1 else max(requests, 200), tokens)) for c in levels]
    return {
        "p50_ms": by_level[0]["p50_ms"],
        "p99_ms": by_level[0]["p99_ms"],
        "max_rps": max(r["rps"] for r in by_level),
        "levels": by_level,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--tokens", type=int, default=16, help="tokens streamed per request")
    p.add_argument("--token-delay-ms", type=float, default=0.0, help="upstream delay between tokens")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=400, help="requests per level")
    p.add_argument("--skip-litellm", action="store_true")
    p.add_argument("--serve", choices=["upstream", "gateway", "litellm-shim"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve == "upstream":
        serve_upstream(args.port, args.tokenizer, args.token_delay_ms / 1000)
        return 0
    if args.serve == "gateway":
        serve_gateway(args.port, args.tokenizer, args.upstream)
        return 0
    if args.serve == "litellm-shim":
        serve_litellm_shim(args.port, args.upstream)
        return 0
    result = run_bench(args)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def run_bench(args: argparse.Namespace) -> dict[str, object]:
    from testing.tiny_tokenizer import write_tiny_tokenizer

    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    me = [sys.executable, "-m", "bench.gateway_bench"]
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp_s, contextlib.ExitStack() as stack:
        tmp = pathlib.Path(tmp_s)
        tok = str(write_tiny_tokenizer(tmp / "tokenizer"))
        up_port, gw_port, ll_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        stack.enter_context(
            process(
                [
                    *me,
                    "--serve",
                    "upstream",
                    "--port",
                    str(up_port),
                    "--tokenizer",
                    tok,
                    "--token-delay-ms",
                    str(args.token_delay_ms),
                ],
                f"{upstream}/healthz",
                tmp / "upstream.log",
            )
        )
        gateway = f"http://127.0.0.1:{gw_port}"
        stack.enter_context(
            process(
                [*me, "--serve", "gateway", "--port", str(gw_port), "--tokenizer", tok, "--upstream", upstream],
                f"{gateway}/readyz",
                tmp / "gateway.log",
            )
        )
        paths = {"direct": f"{upstream}/v1/chat/completions", "gateway": f"{gateway}/v1/chat/completions"}
        litellm_mode = "skipped"
        if not args.skip_litellm:
            litellm = f"http://127.0.0.1:{ll_port}"
            if litellm_proxy_available():
                cfg = tmp / "litellm.yaml"
                cfg.write_text(
                    f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n"
                    f"      model: openai/{MODEL}\n      api_base: {upstream}/v1\n"
                    f"      api_key: sk-bench\n"
                )
                argv = [
                    str(pathlib.Path(sys.executable).with_name("litellm")),
                    "--config",
                    str(cfg),
                    "--port",
                    str(ll_port),
                    "--telemetry",
                    "False",
                ]
                litellm_mode = "proxy"
                ready = f"{litellm}/health/liveliness"
            else:
                argv = [*me, "--serve", "litellm-shim", "--port", str(ll_port), "--upstream", upstream]
                litellm_mode = "sdk-shim (litellm proxy extras not installed)"
                ready = f"{litellm}/docs"
            stack.enter_context(process(argv, ready, tmp / "litellm.log", timeout_s=300))
            paths["litellm"] = f"{litellm}/v1/chat/completions"
        results = {name: measure(url, levels, args.requests, args.tokens) for name, url in paths.items()}
    direct = results["direct"]
    for name, r in results.items():
        if name != "direct":
            r["overhead_p50_ms"] = r["p50_ms"] - direct["p50_ms"]
            r["overhead_p99_ms"] = r["p99_ms"] - direct["p99_ms"]
    gw = results["gateway"]
    ratio = gw["max_rps"] / results["litellm"]["max_rps"] if "litellm" in results else None
    return {
        "tokens_per_request": args.tokens,
        "token_delay_ms": args.token_delay_ms,
        "concurrency": levels,
        "cpus": os.cpu_count(),
        "litellm_mode": litellm_mode,
        "overhead_p50_ms": round(gw["overhead_p50_ms"], 3),
        "overhead_p99_ms": round(gw["overhead_p99_ms"], 3),
        "max_rps": {k: round(v["max_rps"], 1) for k, v in results.items()},
        "throughput_ratio_vs_litellm": None if ratio is None else round(ratio, 2),
        "targets": {"overhead_p50_ms": 2.0, "throughput_ratio_vs_litellm": 2.0},
        "paths": results,
    }


if __name__ == "__main__":
    raise SystemExit(main())
