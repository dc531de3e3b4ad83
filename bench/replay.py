"""`evolving-infra replay`: replay a trace against a live OpenAI-compatible gateway.

    evolving-infra replay --trace ../shared/traces/agents/opencode --base-url http://127.0.0.1:8000 \
        --speed 4 --concurrency 32 --out runs/opencode

Each request carries the branch headers (X-Session-ID, X-Branch-ID,
X-Parent-Branch-ID, X-Branch-Finished) and streams; TTFT is the first content
chunk. Closed-loop turns start `gap_s / speed` after the turns they depend on
finish; others at `arrival_s / speed`. Agent text traces send their real text;
token-count traces (Mooncake, Azure, ServeGen) send a synthetic prompt of about
the right length whose shared blocks repeat the same words, so prefix caching
still applies. Writes report.json and report.png into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from sim import traces
from sim.workloads import Request, Workload


def synthetic_prompt(r: Request, block_tokens: int) -> str:
    """~prompt_tokens words; block i's words derive from its hash so shared blocks match."""
    parts = [" ".join(f"w{h % 9973}x{j % 7}" for j in range(block_tokens // 2)) for h in r.block_hashes]
    rest = max(0, r.prompt_tokens - block_tokens * len(r.block_hashes))
    parts.append(" ".join(f"u{r.req_id}" for _ in range(max(1, rest // 2))))
    return "\n".join(parts)


async def _one(
    client: httpx.AsyncClient, r: Request, prompt: str, model: str, headers: dict[str, str]
) -> dict[str, Any]:
    h = dict(headers)
    h.update({"X-Session-ID": r.session_id, "X-Branch-ID": r.branch_id})
    if r.parent_branch_id:
        h["X-Parent-Branch-ID"] = r.parent_branch_id
    if r.last_in_branch:
        h["X-Branch-Finished"] = "true"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": r.output_tokens,
        "stream": True,
        "temperature": 0,
    }
    t0 = time.perf_counter()
    ttft, chunks, err = None, 0, None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=h) as resp:
            if resp.status_code != 200:
                err = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            else:
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and line.strip() != "data: [DONE]":
                        chunks += 1
                        if ttft is None:
                            ttft = time.perf_counter() - t0
    except httpx.HTTPError as e:
        err = f"{type(e).__name__}: {e}"
    return {
        "req_id": r.req_id,
        "start": t0,
        "ttft_s": ttft,
        "e2e_s": time.perf_counter() - t0,
        "chunks": chunks,
        "error": err,
    }


async def replay(
    wl: Workload,
    prompts: dict[int, str],
    *,
    base_url: str,
    speed: float,
    concurrency: int,
    api_key: str | None,
    model: str,
    progress: bool = True,
) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sem = asyncio.Semaphore(concurrency)
    done: dict[int, asyncio.Event] = {r.req_id: asyncio.Event() for r in wl.requests}
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    n = len(wl.requests)

    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0, connect=10.0)) as client:

        async def run(r: Request) -> None:
            if r.after and wl.closed_loop:
                for a in r.after:
                    await done[a].wait()
                await asyncio.sleep(r.gap_s / speed)
            else:
                await asyncio.sleep(max(0.0, r.arrival_s / speed - (time.perf_counter() - t_start)))
            async with sem:
                res = await _one(client, r, prompts[r.req_id], model, headers)
            res["start"] -= t_start
            results.append(res)
            done[r.req_id].set()
            if progress:
                bad = sum(1 for x in results if x["error"])
                bar = "#" * int(30 * len(results) / n)
                print(f"\r[{bar:<30}] {len(results)}/{n} errors={bad}", end="", file=sys.stderr, flush=True)

        await asyncio.gather(*(run(r) for r in wl.requests))
    if progress:
        print(file=sys.stderr)
    return results


def summarize(results: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if not r["error"]]
    e2e = np.array([r["e2e_s"] for r in ok]) if ok else np.zeros(0)
    ttft = np.array([r["ttft_s"] for r in ok if r["ttft_s"] is not None])

    def pct(x: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(x, q)), 4) if len(x) else None

    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "wall_s": round(wall_s, 2),
        "throughput_rps": round(len(ok) / wall_s, 4) if wall_s > 0 else 0.0,
        "mean_e2e_s": round(float(e2e.mean()), 4) if len(e2e) else None,
        "p95_e2e_s": pct(e2e, 95),
        "mean_ttft_s": round(float(ttft.mean()), 4) if len(ttft) else None,
        "p95_ttft_s": pct(ttft, 95),
        "first_errors": [r["error"] for r in results if r["error"]][:5],
    }


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sorted((r for r in results if not r["error"]), key=lambda r: r["start"])
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.scatter([r["start"] for r in ok], [r["e2e_s"] for r in ok], s=4, label="e2e")
    ax.scatter([r["start"] for r in ok if r["ttft_s"]], [r["ttft_s"] for r in ok if r["ttft_s"]], s=4, label="ttft")
    ax.set_xlabel("start (s)")
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolving-infra replay", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="trace file or agent-trace folder")
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--speed", type=float, default=1.0, help="time compression (2 = twice as fast)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--api-key")
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokenizer", help="HF tokenizer name/path for text traces (chars/4 without one)")
    ap.add_argument("--limit", type=int, help="first N requests")
    ap.add_argument("--out", default="replay-out")
    a = ap.parse_args(argv)
    if a.speed <= 0 or a.concurrency <= 0:
        ap.error("--speed and --concurrency must be > 0")
    path = Path(a.trace)
    prompts: dict[int, str]
    try:  # a bad trace: its file and line, exit 2, nothing sent
        if traces.trace_format(path) == "agent-text":
            tok = None
            if a.tokenizer:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(a.tokenizer)
            wl, turns = traces.load_agent_text(path, tok, limit=a.limit)
            prompts = {t.request.req_id: t.prompt for t in turns}
        else:
            wl = traces.load_any(path, limit=a.limit)
            prompts = {r.req_id: synthetic_prompt(r, wl.block_tokens) for r in wl.requests}
    except traces.TraceError as e:
        ap.error(str(e))
    t0 = time.perf_counter()
    results = asyncio.run(
        replay(
            wl, prompts, base_url=a.base_url, speed=a.speed, concurrency=a.concurrency, api_key=a.api_key, model=a.model
        )
    )
    report = {
        "trace": str(path),
        "speed": a.speed,
        "concurrency": a.concurrency,
        **summarize(results, time.perf_counter() - t0),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**report, "requests_detail": results}, indent=1))
    _plot(results, out / "report.png")
    print(json.dumps(report, indent=1))
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
