"""`evolving-infra simulate --fidelity --json`: the simulator against the live demo cluster.

One deterministic coding-agent slice (token-id prompts <= 3,000 tokens that
grow turn by turn over a shared system prompt, outputs 16-128 tokens) is
replayed open-loop on a live gateway + 1 prefill + 1 decode worker (demo
model, ports 8470-8472). The workers' own iteration records from that run fit
`planner.profile.Profile`; `GpuProfile.from_planner_profile` turns it into a
simulator profile; the simulator then runs the same requests (same actual
send times, same output lengths as the live run produced, same block size and
local-prefill threshold, static 1P1D, no planner).

Definitions, identical on both sides (from per-request rows):
- ttft: first streamed token at the client - send time (sim: first token time
  - arrival); e2e: last token - send time.
- throughput: completed requests / (last finish - first send).

What a request spends outside the iterations the profile models (engine
input/output, KV pulls, the gateway and HTTP path, the handoff) is measured
on the live run, never tuned to the result: `bench/fidelity_latency.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench._kvbench import iterations_since, next_iteration_index
from bench.fidelity_latency import (
    EngineLatencies,
    engine_latencies,
    handoff_s,
    path_overhead_s,
    step_overhead_ms,
    stream_lag_s,
)
from bench.planner_bench import to_planner_records
from planner.profile import Profile
from planner.types import IterationRecord
from routing.picker import RouterConfig
from sim.cluster import Cluster, SimConfig
from sim.profiles import GpuProfile
from sim.state import NodeConfig
from sim.workloads import Request, Workload

PORTS = (8470, 8471, 8472)  # prefill worker, decode worker, gateway
BLOCK_TOKENS = 32  # workers' and gateway's block size
LOCAL_PREFILL_MAX = 256  # GatewaySettings default = RouterConfig default
CHUNK_TOKENS = 2048  # workers.engine max_num_batched_tokens
MAX_BATCH = 64  # workers --max-num-seqs default
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2  # K,V x 2 layers x 2 KV heads x head_dim 32 x bf16
MODEL_NAME = "demo-model"


@dataclass(frozen=True)
class SliceConfig:
    sessions: int = 12
    turns: int = 8
    system_tokens: int = 384  # shared by every session (same blocks)
    task_tokens: tuple[int, int] = (200, 700)
    append_tokens: tuple[int, int] = (48, 400)  # tool output appended per turn
    output_tokens: tuple[int, int] = (16, 128)
    max_prompt: int = 3000
    stagger_s: float = 1.0  # session start spacing
    turn_gap_s: float = 3.0  # nominal spacing of a session's turns
    seed: int = 0


def _block_hashes(tokens: list[int], bt: int) -> tuple[int, ...]:
    out, h = [], 0
    for i in range(len(tokens) // bt):
        h = hash((h, tuple(tokens[i * bt : (i + 1) * bt])))  # ints/tuples: stable across runs
        out.append(h)
    return tuple(out)


def build_slice(cfg: SliceConfig = SliceConfig()) -> tuple[list[Request], dict[int, list[int]]]:
    """Open-loop agent slice: requests (arrival order) and their prompt token ids."""
    rng = random.Random(cfg.seed)
    tok = lambda n: [rng.randrange(10, 4000) for _ in range(n)]  # noqa: E731
    system = tok(cfg.system_tokens)
    rows: list[tuple[float, str, int, list[int], int, bool]] = []
    for s in range(cfg.sessions):
        ctx = system + tok(rng.randint(*cfg.task_tokens))
        for k in range(cfg.turns):
            if k:
                ctx = ctx + tok(rng.randint(*cfg.append_tokens))
            if len(ctx) > cfg.max_prompt:
                break
            t = s * cfg.stagger_s + k * cfg.turn_gap_s + rng.uniform(0.0, 0.5)
            rows.append((t, f"s{s}", k, list(ctx), rng.randint(*cfg.output_tokens), k == cfg.turns - 1))
    rows.sort(key=lambda r: r[0])
    reqs, prompts = [], {}
    for i, (t, sess, _k, ids, out, last) in enumerate(rows):
        reqs.append(
            Request(
                i,
                sess,
                f"{sess}-b",
                t,
                len(ids),
                out,
                _block_hashes(ids, BLOCK_TOKENS),
                last_in_branch=last,
                kind="coding",
            )
        )
        prompts[i] = ids
    return reqs, prompts


def calibration_prompts(n: int = 6, seed: int = 99) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(10, 4000) for _ in range(rng.choice([400, 900, 1600, 2400]))], 32) for _ in range(n)]


# -- metrics (same definitions for live and sim) ----------------------------------
def summarize(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    """rows: (send/arrival, first token, finish) in seconds on one clock."""
    a = np.array(rows, dtype=float)
    window = float(a[:, 2].max() - a[:, 0].min())
    return {
        "completed": len(a),
        "window_s": round(window, 3),
        "throughput_rps": round(len(a) / window, 4),
        "mean_e2e_s": round(float((a[:, 2] - a[:, 0]).mean()), 4),
        "mean_ttft_s": round(float((a[:, 1] - a[:, 0]).mean()), 4),
    }


def rel_err(sim: float, live: float) -> float:
    return round(abs(sim - live) / live, 4) if live else float("inf")


# -- simulator side -----------------------------------------------------------------
def simulate(reqs: list[Request], gpu: GpuProfile, *, overhead_s: float = 0.0) -> list[tuple[float, float, float]]:
    """Run static 1P1D; rows relative to the requests' own arrival (overhead counted in)."""
    shifted = tuple(replace(r, arrival_s=r.arrival_s + overhead_s) for r in reqs)
    horizon = max(r.arrival_s for r in shifted) + 3600.0
    wl = Workload("fidelity", shifted, horizon, block_tokens=BLOCK_TOKENS, closed_loop=False)
    cfg = SimConfig(nodes=2, prefill_nodes=1, horizon_s=horizon, router=RouterConfig(LOCAL_PREFILL_MAX))
    log = Cluster(wl, gpu, None, cfg).run()
    return [(arr - overhead_s, ft, fin) for arr, ft, fin, *_ in log.rows]


def fitted_gpu(
    records: list[IterationRecord],
    overhead_ms: float,
    kv_capacity_tokens: int,
    handoff_s: float = 0.0,
    prefill_answer_s: float = 0.0,
    engine: EngineLatencies | None = None,
    stream_lag_s: float = 0.0,
) -> GpuProfile:
    profile = Profile.from_records(records)
    e = engine or EngineLatencies(0.0, 0.0, 0.0, 0.0, 0.0, {})
    node = NodeConfig(
        chunk_tokens=CHUNK_TOKENS,
        max_batch=MAX_BATCH,
        kv_capacity_tokens=kv_capacity_tokens,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        pool_gbps=1.0,
        d2h_gbps=2.0,
        switch_overhead_s=0.0,
        handoff_s=handoff_s,
        prefill_answer_s=prefill_answer_s,
        engine_in_s=e.engine_in_s,
        engine_out_s=e.engine_out_s,
        pull_latency_s=e.pull_latency_s,
        prefill_pull_latency_s=e.prefill_pull_latency_s,
        stream_lag_s=stream_lag_s,
    )
    return GpuProfile.from_planner_profile(
        profile, name="demo-model-cpu-fitted", node=node, step_overhead_ms=overhead_ms
    )


# -- live side ------------------------------------------------------------------------
async def _send(client: httpx.AsyncClient, ids: list[int], max_tokens: int, headers: dict[str, str]) -> dict:
    body = {
        "model": MODEL_NAME,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = None
    rid = None
    usage: dict[str, Any] = {}
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            rid = rid or chunk.get("id")
            if chunk.get("choices") and ttft is None:
                ttft = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
    t1 = time.perf_counter()
    return {
        "t0": t0,
        "ttft": ttft or t1,
        "t1": t1,
        "id": rid,
        "out": int(usage.get("completion_tokens", max_tokens)),
        "cached": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
    }


async def _replay(url: str, reqs: list[Request], prompts: dict[int, list[int]]) -> tuple[float, list[dict]]:
    async with httpx.AsyncClient(
        base_url=url, timeout=httpx.Timeout(300.0, connect=10.0), limits=httpx.Limits(max_connections=256)
    ) as client:
        t_start = time.perf_counter()

        async def one(r: Request) -> dict:
            await asyncio.sleep(max(0.0, r.arrival_s - (time.perf_counter() - t_start)))
            h = {"X-Session-ID": r.session_id, "X-Branch-ID": r.branch_id}
            if r.last_in_branch:
                h["X-Branch-Finished"] = "true"
            return await _send(client, prompts[r.req_id], r.output_tokens, h)

        return t_start, await asyncio.gather(*(one(r) for r in reqs))


async def _sequential(url: str, items: list[tuple[list[int], int]]) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=300.0) as client:
        out = []
        for i, (ids, n) in enumerate(items):
            out.append(await _send(client, ids, n, {"X-Branch-ID": f"cal-{i}-{time.time_ns()}"}))
            await asyncio.sleep(0.3)
        return out


@contextlib.contextmanager
def _gateway(worker_urls: list[str], port: int, data_dir: str, model: str):
    """The gateway in its own process, as deployed: the replaying client must
    not share an interpreter (and its GIL) with the server it measures."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "EVOLVING_AUTH": "open",
        "EVOLVING_PLANNER": "none",
        "EVOLVING_HEARTBEAT_S": "0.2",
        "EVOLVING_LOCAL_PREFILL_MAX": str(LOCAL_PREFILL_MAX),
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "gateway",
        "--model",
        model,
        "--model-name",
        MODEL_NAME,
        "--port",
        str(port),
        "--block-size",
        str(BLOCK_TOKENS),
        "--worker-urls",
        ",".join(worker_urls),
        "--data-dir",
        data_dir,
    ]
    with open(Path(data_dir, "gateway.log"), "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode} (log: {data_dir}/gateway.log)")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(url + "/readyz", timeout=2)
                if r.status_code == 200 and r.json().get("workers") == len(worker_urls):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("gateway not ready")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def live_run(reqs: list[Request], prompts: dict[int, list[int]], model: str) -> dict[str, Any]:
    from testing.worker_process import WorkerProcess

    tmp = tempfile.mkdtemp(prefix="fidelity-")
    extra = ["--run-dir", f"{tmp}/run", "--block-size", str(BLOCK_TOKENS)]
    p = WorkerProcess(PORTS[0], "prefill", model, "fp-prefill", threads_bind="0", log_path=f"{tmp}/p.log", extra=extra)
    d = WorkerProcess(PORTS[1], "decode", model, "fp-decode", threads_bind="1", log_path=f"{tmp}/d.log", extra=extra)
    try:
        p.start(), d.start()
        p.wait_ready(), d.wait_ready()
        with _gateway([p.url, d.url], PORTS[2], tmp, model) as url:
            asyncio.run(_sequential(url, calibration_prompts(3, seed=7)))  # warm-up, discarded
            since = {w.node_id: next_iteration_index(w.url) for w in (p, d)}
            cal = asyncio.run(_sequential(url, calibration_prompts()))  # one at a time: the isolated path overhead
            t_start, res = asyncio.run(_replay(url, reqs, prompts))
            records: list[IterationRecord] = []
            timings: dict[str, dict] = {}
            for w in (p, d):
                records += to_planner_records(w.node_id, iterations_since(w.url, since[w.node_id]))
                for t in httpx.get(w.url + "/internal/requests", timeout=30).json():
                    timings[t["request_id"]] = {**t, "node_id": w.node_id}
    finally:
        p.stop()
        d.stop()
    return {
        "t_start": t_start,
        "results": res,
        "calibration": cal,
        "records": sorted(records, key=lambda r: r.t),
        "timings": timings,
        "log_dir": tmp,
    }


def fidelity(model: str = "data/demo-model", cfg: SliceConfig = SliceConfig()) -> dict[str, Any]:
    reqs, prompts = build_slice(cfg)
    live = live_run(reqs, prompts, model)
    res, t_start = live["results"], live["t_start"]
    live_rows = [(x["t0"] - t_start, x["ttft"] - t_start, x["t1"] - t_start) for x in res]
    # The sim gets the live send times and output lengths (the demo model may stop at EOS early).
    sim_reqs = [
        replace(r, arrival_s=x["t0"] - t_start, output_tokens=max(1, x["out"])) for r, x in zip(reqs, res, strict=False)
    ]
    records = live["records"]
    ovh_ms = step_overhead_ms(records)
    # Streamed first tokens (prefilled on the decode node) set the path every
    # request takes; a prefill node's non-streaming answer costs more.
    req_ovh = path_overhead_s(res, live["timings"], "decode")
    if req_ovh is None:
        raise RuntimeError("the workers reported no engine first-token times (vLLM request stats off?)")
    isolated_ovh = path_overhead_s(live["calibration"], live["timings"])
    hop = handoff_s(res, live["timings"]) or 0.0
    eng = engine_latencies(records, live["timings"])
    # A prefill node's first token, from its iteration's end to the client, beyond a streamed one's.
    answer = max(
        0.0,
        (path_overhead_s(res, live["timings"], "prefill") or req_ovh) + eng.prefill_out_s - req_ovh - eng.engine_out_s,
    )
    # The simulated iteration already ends `ovh_ms` after the record's end (the step overhead is in its time).
    eng = replace(eng, engine_out_s=max(0.0, eng.engine_out_s - ovh_ms / 1000.0))
    lag = max(0.0, stream_lag_s(res, live["timings"]) or 0.0)
    gpu = fitted_gpu(
        records,
        ovh_ms,
        kv_capacity_tokens=(1 << 30) // KV_BYTES_PER_TOKEN,
        handoff_s=hop,
        prefill_answer_s=answer,
        engine=eng,
        stream_lag_s=lag,
    )
    live_sum = summarize(live_rows)
    sim_rows = simulate(sim_reqs, gpu, overhead_s=req_ovh)
    sim_sum = summarize(sim_rows)
    detail = [
        {
            "req_id": r.req_id,
            "prompt": r.prompt_tokens,
            "out": r.output_tokens,
            "cached_live": x["cached"],
            "first_role": (live["timings"].get(f"{x['id']}.1") or {}).get("role"),
            "live": [round(v, 4) for v in lr],
            "sim": [round(v, 4) for v in sr],
        }
        for r, x, lr, sr in zip(sim_reqs, res, live_rows, sorted(sim_rows), strict=False)
    ]
    Path(live["log_dir"], "fidelity-detail.json").write_text(json.dumps(detail, indent=0))
    Path(live["log_dir"], "requests.json").write_text(
        json.dumps(
            {
                "results": [{k: x[k] for k in ("id", "t0", "ttft", "t1", "out", "cached")} for x in res],
                "engine": live["timings"],
                "t_start": t_start,
            }
        )
    )
    Path(live["log_dir"], "iterations.json").write_text(
        json.dumps(
            [
                [
                    r.node_id,
                    r.phase.value,
                    r.t,
                    r.batch_size,
                    r.uncached_prompt_tokens,
                    r.cached_prompt_tokens,
                    r.generated_tokens,
                    r.context_tokens,
                    r.elapsed_ms,
                ]
                for r in records
            ]
        )
    )
    sim_raw = summarize(simulate(sim_reqs, gpu))
    err = {
        "throughput": rel_err(sim_sum["throughput_rps"], live_sum["throughput_rps"]),
        "mean_e2e": rel_err(sim_sum["mean_e2e_s"], live_sum["mean_e2e_s"]),
        "mean_ttft": rel_err(sim_sum["mean_ttft_s"], live_sum["mean_ttft_s"]),
    }
    m = gpu.model
    return {
        "fidelity_error": err,
        "target": 0.15,
        "requests": len(reqs),
        "live": {
            **live_sum,
            "cached_tokens": sum(x["cached"] for x in res),
            "output_tokens": sum(x["out"] for x in res),
        },
        "sim": sim_sum,
        "sim_without_request_overhead": sim_raw,
        "calibration": {
            "records": len(records),
            "step_overhead_ms": round(ovh_ms, 3),
            "request_overhead_s": round(req_ovh, 4),
            "request_overhead_isolated_s": round(isolated_ovh, 4) if isolated_ovh is not None else None,
            "handoff_s": round(hop, 4),
            "prefill_answer_s": round(answer, 4),
            "engine_in_s": round(eng.engine_in_s, 4),
            "engine_out_s": round(eng.engine_out_s, 4),
            "pull_latency_s": round(eng.pull_latency_s, 4),
            "prefill_pull_latency_s": round(eng.prefill_pull_latency_s, 4),
            "prefill_out_s": round(eng.prefill_out_s, 4),
            "stream_lag_s": round(lag, 4),
            "engine_samples": eng.samples,
            "detail": str(Path(live["log_dir"], "fidelity-detail.json")),
            "prefill_ms": [round(x, 6) for x in m.prefill],
            "decode_ms": [round(x, 6) for x in m.decode],
        },
        "slice": {
            "sessions": cfg.sessions,
            "turns": cfg.turns,
            "seed": cfg.seed,
            "max_prompt_tokens": max(r.prompt_tokens for r in reqs),
            "local_prefill_max_tokens": LOCAL_PREFILL_MAX,
            "block_tokens": BLOCK_TOKENS,
        },
    }


def main(model: str = "data/demo-model", seed: int = 0, as_json: bool = True) -> int:
    report = fidelity(model, SliceConfig(seed=seed))
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        e = report["fidelity_error"]
        print(
            f"fidelity error: throughput {e['throughput']:.3f}  mean e2e {e['mean_e2e']:.3f}  "
            f"mean ttft {e['mean_ttft']:.3f}  (target <= {report['target']})"
        )
    return 0 if max(report["fidelity_error"].values()) <= report["target"] else 1


def cli(argv: list[str] | None = None) -> int:
    """`evolving-infra simulate --fidelity [--seed N] [--json]` (dispatched here by `cli.main`)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="evolving-infra simulate --fidelity",
        description="the live demo cluster and the simulator on one agent trace slice",
    )
    ap.add_argument("--fidelity", action="store_true", required=True)
    ap.add_argument("--model", default="data/demo-model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the JSON report")
    a = ap.parse_args(argv)
    return main(model=a.model, seed=a.seed, as_json=a.json)


if __name__ == "__main__":
    raise SystemExit(cli())
