"""`evolving-infra bench prefetch --json`: async KV prefetch vs layer-by-layer
loading on a prefill node, replaying multi-turn agent sessions.

Workload. `sessions` agents run concurrently. Session s starts from a context
of `base_tokens` (drawn uniformly from the range: system prompt, tools,
task); each turn appends an assistant message (`assistant_tokens`) and a tool
output (`tool_tokens`) and asks the prefill node P for the next step
(role prefill: compute the uncached tail, return the first token, save the
new blocks). Between turns a session "runs its tool" for `think_s` seconds.

Where the cached prefix lives. Before the replay, the peer node C computes
and saves every turn's cached prefix (the previous turn's context) in its
host store. P never holds it: each (mode, session, turn) uses its own tenant
salt, so P's device prefix cache and host store never match and every turn
pulls its whole prefix from C over NIXL (`kv.load` = C's block locations).
This models the router sending a turn to a prefill node other than the one
that holds the agent's KV, the case the async prefetch is for. The same
replay (same tokens, same arrival schedule) runs once per mode on P:
`async` (pull on a background thread while the request waits in vLLM's
WAITING_FOR_REMOTE_KVS; other requests keep computing) and `layerwise`
(pull inside the engine step that schedules the request; the whole batch
waits for it).

Metrics per mode (all from P's own iteration records, GET /internal/stats,
and this client's clock; worker and client share the host clock):

- pending time: union over P's requests of [sent, answered]: time during
  which at least one request was waiting at P or running on it.
- busy time: union over P's iterations of [t - elapsed, t] (engine steps that
  computed tokens; vLLM does not record 0-token polling steps).
- `gap_idle_fraction` = |pending minus busy| / |pending|: no step ran while
  work was waiting (async mode: requests whose KV is still arriving while
  nothing else is runnable).
- `kv_wait_in_step_s`: time steps spent waiting for KV inside the step
  (layerwise mode only; 0 for async by construction). Not recorded by the
  worker, so estimated: a linear step-time model
  elapsed_ms ~ a + b*uncached + c*uncached*context/1000 + d*batch is fitted
  on the async run's iterations (steps with no in-step KV load), and the
  layerwise run's total excess over it, clipped at 0, is the in-step wait.
- `idle_fraction` = (|pending minus busy| + kv_wait_in_step_s) / |pending|:
  the share of the time with work pending during which P did no model
  compute. `idle_fraction_reduction` = layerwise - async, in points (and
  the relative reduction).
- TTFT: request sent -> P's answer (which carries the first token), p50/p95.

What to expect here. With the demo model one block is 16 KiB (2 layers, 2
KV heads, head_dim 32, 32 tokens, bf16), so even a 7k-token prefix is
~3.5 MiB, which NIXL moves in a few milliseconds while a vLLM-CPU step takes
tens: the in-step wait that async prefetch removes is ~1-3 ms per request.
Measured on 2 shared cores, async came out *worse* (more gap idle, higher
median TTFT): its fixed costs (the WAITING_FOR_REMOTE_KVS round trip of at
least one extra engine step, and a Python load thread that competes for the
GIL and the single core with the engine's busy-polling loop) exceed the
transfer it hides. Async prefetch pays off when the transfer is long
relative to a step (large KV per token, slower links, GPU-speed compute);
long contexts and many concurrent sessions are the only levers that keep
this model, `--model` takes a larger one.

Run: `python -m bench.prefetch_bench --json` (starts P and C on ports
8410/8411, pinned to cores 0 and 1; prints one JSON object last).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import random
import time
import uuid
from dataclasses import dataclass

import httpx
import numpy as np

from bench._kvbench import (
    BenchError,
    WorkerSpec,
    generate,
    iterations_since,
    local_workers,
    next_iteration_index,
    node_id,
    percentile,
    phase_of,
    set_phase,
    synthetic_tokens,
)

BLOCK = 32


@dataclass(frozen=True)
class Workload:
    sessions: int = 8
    turns: int = 6
    base_tokens: tuple[int, int] = (2500, 4500)
    tool_tokens: tuple[int, int] = (40, 400)
    assistant_tokens: tuple[int, int] = (24, 64)
    think_s: tuple[float, float] = (0.02, 0.2)
    seed: int = 0

    def contexts(self) -> list[list[list[int]]]:
        """contexts[s][k]: session s's prompt at turn k (k=0 is the starting context)."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.sessions):
            ctx = [synthetic_tokens(rng.randint(*self.base_tokens), rng)]
            for _ in range(self.turns):
                add = rng.randint(*self.assistant_tokens) + rng.randint(*self.tool_tokens)
                ctx.append(ctx[-1] + synthetic_tokens(add, rng))
            out.append(ctx)
        return out

    def schedule(self) -> list[list[float]]:
        """think[s][k]: seconds session s waits before sending turn k+1."""
        rng = random.Random(self.seed + 1)
        return [[rng.uniform(*self.think_s) for _ in range(self.turns)] for _ in range(self.sessions)]


# -- pure metrics --------------------------------------------------------------


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def measure(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in merge(intervals))


def overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """|union(xs) intersect union(ys)|."""
    total, ys = 0.0, merge(ys)
    for a, b in merge(xs):
        for c, d in ys:
            total += max(0.0, min(b, d) - max(a, c))
    return total


def _features(it: dict) -> list[float]:
    context = it["uncached_prompt_tokens"] + it["cached_prompt_tokens"]
    return [1.0, it["uncached_prompt_tokens"], it["uncached_prompt_tokens"] * context / 1000.0, it["batch_size"]]


def fit_step_model(iterations: list[dict]) -> np.ndarray:
    """Least-squares coefficients of elapsed_ms over `_features`."""
    x = np.array([_features(i) for i in iterations])
    y = np.array([i["elapsed_ms"] for i in iterations])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return coef


def excess_step_s(iterations: list[dict], coef: np.ndarray) -> float:
    """Total step time beyond the model, clipped at 0 (seconds)."""
    if not iterations:
        return 0.0
    pred = np.array([_features(i) for i in iterations]) @ coef
    return max(0.0, float(np.sum(np.array([i["elapsed_ms"] for i in iterations]) - pred)) / 1000.0)


def summarize(requests: list[dict], iterations: list[dict], kv_wait_in_step_s: float) -> dict:
    pending = [(r["sent"], r["answered"]) for r in requests]
    busy = [(i["t"] - i["elapsed_ms"] / 1000.0, i["t"]) for i in iterations]
    pending_s = measure(pending)
    gap_s = pending_s - overlap(pending, busy)
    ttft = [r["ttft_s"] for r in requests]
    offered = sum(r["offered_tokens"] for r in requests)
    return {
        "requests": len(requests),
        "pending_s": pending_s,
        "busy_s": measure(busy),
        "iterations": len(iterations),
        "gap_idle_s": gap_s,
        "kv_wait_in_step_s": kv_wait_in_step_s,
        "gap_idle_fraction": gap_s / pending_s,
        "idle_fraction": (gap_s + kv_wait_in_step_s) / pending_s,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "ttft_mean_s": sum(ttft) / len(ttft),
        "prompt_tokens": sum(r["prompt_tokens"] for r in requests),
        "offered_cached_tokens": offered,
        "loaded_cached_tokens": sum(r["cached_tokens"] for r in requests),
        "pull_hit_fraction": sum(r["cached_tokens"] for r in requests) / offered if offered else 0.0,
    }


# -- shell ---------------------------------------------------------------------


def prepare_peer(peer_url: str, tasks: list[tuple[str, list[int]]], parallel: int = 4) -> dict[str, list[dict]]:
    """Compute each (salt, prefix) on the peer; salt -> its saved block locations."""

    def one(task: tuple[str, list[int]]) -> tuple[str, list[dict]]:
        salt, prefix = task
        out = generate(
            peer_url,
            {
                "request_id": f"pf-prep-{uuid.uuid4().hex[:12]}",
                "prompt_token_ids": prefix,
                "role": "prefill",
                "tenant_salt": salt,
            },
        )
        blocks = out.get("saved_blocks") or []
        if len(blocks) != len(prefix) // BLOCK:
            raise BenchError(f"peer saved {len(blocks)} blocks of {len(prefix) // BLOCK}")
        return salt, blocks

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return dict(pool.map(one, tasks))


async def replay(
    p_url: str, peers: dict[str, str], mode: str, tag: str, contexts, schedule, salts, blocks
) -> list[dict]:
    """All sessions concurrently, each turn after the previous answer + think time."""
    records: list[dict] = []

    async def session(client: httpx.AsyncClient, s: int) -> None:
        for k in range(1, len(contexts[s])):
            await asyncio.sleep(schedule[s][k - 1])
            salt, prompt = salts[(tag, s, k)], contexts[s][k]
            body = {
                "request_id": f"pf-{mode}-{s}-{k}-{uuid.uuid4().hex[:6]}",
                "prompt_token_ids": prompt,
                "role": "prefill",
                "stream": False,
                "tenant_salt": salt,
                "kv": {"load": blocks[salt], "peers": peers, "mode": mode},
            }
            sent, t0 = time.time(), time.perf_counter()
            r = await client.post(p_url + "/internal/generate", json=body, timeout=300)
            ttft, answered = time.perf_counter() - t0, time.time()
            if r.status_code != 200:
                raise BenchError(f"turn {s}/{k} failed: {r.status_code} {r.text}")
            out = r.json()
            records.append(
                {
                    "session": s,
                    "turn": k,
                    "first_token": (out.get("token_ids") or [None])[0],
                    "sent": sent,
                    "answered": answered,
                    "ttft_s": ttft,
                    "prompt_tokens": len(prompt),
                    "offered_tokens": len(blocks[salt]) * BLOCK,
                    "cached_tokens": out.get("cached_tokens", 0),
                }
            )

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(session(client, s) for s in range(len(contexts))))
    return records


def run_bench(
    prefill_url: str,
    peer_url: str,
    workload: Workload = Workload(),
    modes: tuple[str, ...] = ("async", "layerwise"),
    repeats: int = 1,
) -> dict:
    """Replay `workload` `repeats` times per mode on the prefill node, modes
    interleaved (so slow drift in the machine's load hits both alike);
    restores phases. Per-mode metrics pool all repeats."""
    contexts, schedule = workload.contexts(), workload.schedule()
    run = uuid.uuid4().hex[:10]
    salts = {
        (f"{m}{r}", s, k): f"pf-{run}-{m}{r}-{s}-{k}"
        for m in modes
        for r in range(repeats)
        for s in range(workload.sessions)
        for k in range(1, workload.turns + 1)
    }
    warm = {m: (f"pf-{run}-{m}-warm", synthetic_tokens(40 * BLOCK + 7, random.Random(99))) for m in modes}
    phases = {prefill_url: phase_of(prefill_url), peer_url: phase_of(peer_url)}
    result: dict = {
        "repeats": repeats,
        "workload": {
            **workload.__dict__,
            "total_prompt_tokens_per_replay": sum(len(c) for ctx in contexts for c in ctx[1:]),
        },
    }
    try:
        set_phase(prefill_url, "prefill")
        set_phase(peer_url, "prefill")
        t0 = time.perf_counter()
        tasks = [(salts[key], contexts[key[1]][key[2] - 1]) for key in salts]
        blocks = prepare_peer(peer_url, tasks + [(salt, toks[:-7]) for salt, toks in warm.values()])
        result["peer_prepare_s"] = time.perf_counter() - t0
        peers = {node_id(peer_url): peer_url}
        runs: dict[str, tuple[list[dict], list[dict]]] = {m: ([], []) for m in modes}
        for tag, m in [(f"{m}{r}", m) for r in range(repeats) for m in modes]:
            salt, toks = warm[m]  # first pull connects the NIXL peer; keep it out of the window
            generate(
                prefill_url,
                {
                    "request_id": f"pf-warm-{m}-{run}",
                    "prompt_token_ids": toks,
                    "role": "prefill",
                    "tenant_salt": salt,
                    "kv": {"load": blocks[salt], "peers": peers, "mode": m},
                },
            )
            since = next_iteration_index(prefill_url)
            recs = asyncio.run(replay(prefill_url, peers, m, tag, contexts, schedule, salts, blocks))
            time.sleep(0.5)  # let the last iteration records reach the stats ring
            lo, hi = min(r["sent"] for r in recs), max(r["answered"] for r in recs)
            its = [i for i in iterations_since(prefill_url, since) if lo <= i["t"] <= hi + 0.5]
            runs[m][0].extend(recs)
            runs[m][1].extend(its)
    finally:
        for url, phase in phases.items():
            set_phase(url, phase)
    base = runs.get("async")
    coef = fit_step_model(base[1]) if base and len(base[1]) >= 8 else None
    for m, (recs, its) in runs.items():
        wait = excess_step_s(its, coef) if (m == "layerwise" and coef is not None) else 0.0
        result[m] = summarize(recs, its, wait)
    if coef is not None:
        result["step_model_ms"] = {
            "intercept": coef[0],
            "per_uncached_token": coef[1],
            "per_uncached_x_kcontext": coef[2],
            "per_request": coef[3],
        }
    # Same context, same greedy model: every mode and repeat must give the same first token.
    firsts: dict[tuple[int, int], set] = {}
    for recs, _ in runs.values():
        for r in recs:
            firsts.setdefault((r["session"], r["turn"]), set()).add(r["first_token"])
    result["first_tokens_identical"] = all(len(v) == 1 and None not in v for v in firsts.values())
    if "async" in result and "layerwise" in result:
        a, lw = result["async"], result["layerwise"]
        result["idle_fraction_reduction"] = lw["idle_fraction"] - a["idle_fraction"]
        result["idle_fraction_reduction_relative"] = (
            result["idle_fraction_reduction"] / lw["idle_fraction"] if lw["idle_fraction"] > 0 else 0.0
        )
        result["gap_idle_fraction_reduction"] = lw["gap_idle_fraction"] - a["gap_idle_fraction"]
        result["ttft_p95_ratio_layerwise_over_async"] = lw["ttft_p95_s"] / a["ttft_p95_s"]
    return result


def _range(text: str, cast=int) -> tuple:
    lo, _, hi = text.partition(",")
    return cast(lo), cast(hi or lo)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench prefetch")
    p.add_argument("--model", default="data/demo-model")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2, help="replays per mode, interleaved")
    p.add_argument("--base-tokens", default="2500,4500", help="LO,HI starting context per session")
    p.add_argument("--tool-tokens", default="40,400", help="LO,HI tool output per turn")
    p.add_argument("--assistant-tokens", default="24,64", help="LO,HI assistant message per turn")
    p.add_argument("--think-s", default="0.02,0.2", help="LO,HI seconds between turns")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--port", type=int, default=8410, help="prefill node on PORT, peer on PORT+1")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = p.parse_args(argv)
    workload = Workload(
        args.sessions,
        args.turns,
        _range(args.base_tokens),
        _range(args.tool_tokens),
        _range(args.assistant_tokens),
        _range(args.think_s, float),
        args.seed,
    )
    extra = ("--max-model-len", str(args.max_model_len), "--kv-store-gib", "1")
    specs = [
        WorkerSpec("pfP", args.port, "prefill", "0", extra),
        WorkerSpec("pfC", args.port + 1, "prefill", "1", extra),
    ]
    with local_workers(specs, args.model, args.log_dir) as (p_url, c_url):
        result = run_bench(p_url, c_url, workload, repeats=args.repeats)
    result["model"] = args.model
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
