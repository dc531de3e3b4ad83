"""`evolving-infra bench planner --json`: model fit on real workers, decision time.

(1) Starts a prefill and a decode worker on the demo model, drives a mixed
load (prefills of varied uncached length over varied cached prefixes;
decode batches of varied size and context), takes the workers' own
per-iteration records, fits the planner's iteration-time models online on
the earlier 70 % and reports the mean absolute percentage error on the
later, held-back 30 % (`fit_mape_prefill`, `fit_mape_decode`), and how
often the models' own 90 % band covered those steps (`fit_band_coverage`).
Each record carries the CPU share its engine got (`cpu_share`, measured
by the worker itself, `workers.iterations`, as in production): what shares
the cores is a feature of the model (`planner.share`).
(2) Times one planner decision on synthetic clusters of 16, 256 and 3,072
nodes, on open-loop traffic (`decide_ms`) and on agent traffic, three turns
in four closing a loop (`decide_ms_closed_loop`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import httpx
import numpy as np

from core import Phase
from planner.evolving import EvolvingConfig, EvolvingPlanner
from planner.fit_check import fit_mape
from planner.profile import Profile
from planner.types import IterationRecord
from testing.planner_records import closed_loop, synthetic_records, synthetic_samples, synthetic_view
from testing.worker_process import WorkerProcess


def decide_bench(node_counts: Iterable[int] = (16, 256, 3072), repeats: int = 20) -> dict[str, dict[str, float]]:
    """Median time of one ``decide`` in ms, keyed by node count (as str):
    ``decide_ms`` wall clock (the target), ``decide_cpu_ms`` this process's
    CPU time (the same number on an idle machine; stable on a busy one), on
    open-loop traffic; ``decide_ms_closed_loop`` and
    ``decide_cpu_ms_closed_loop`` the same on agent traffic, where most
    turns follow the branch's previous one after a think time (the
    estimator then solves each split's closed-loop fixed point)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    profile = Profile.from_records(synthetic_records(2000, seed=1))
    out: dict[str, dict[str, float]] = {}
    for suffix, closed in (("", 0.0), ("_closed_loop", 0.75)):
        wall: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for n in node_counts:
            planner = EvolvingPlanner(EvolvingConfig(), profile)
            # Traffic scaled to the cluster so every size runs near the same utilisation.
            samples = synthetic_samples(
                0.0, 180.0, 0.25 * n, uncached=2000, cached=6000, output=400, seed=2, local_share=0.3
            )
            planner.observe_requests(closed_loop(samples, closed, think_s=5.0, e2e_s=8.0, seed=3))
            view = synthetic_view(n, now=180.0)
            planner.decide(view)  # warm caches
            walls, cpus = [], []
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                planner.decide(view)
                walls.append((time.perf_counter() - t0) * 1000.0)
                cpus.append((time.process_time() - c0) * 1000.0)
            wall[str(n)] = float(np.median(walls))
            cpu[str(n)] = float(np.median(cpus))
        out["decide_ms" + suffix] = wall
        out["decide_cpu_ms" + suffix] = cpu
    return out


def fit_mape_from_records(records: Iterable[IterationRecord], holdout_fraction: float = 0.3) -> dict[str, Any]:
    """``{"fit_mape_prefill", "fit_mape_decode"}``: hold-out MAPE (fraction) of
    models fitted online on the earlier records; None where a kind is absent.
    ``fit_mape_floor``: the same error of a hindsight fit on all records
    (``FitReport.floor_*``), so a reader can tell model error from noise.
    ``fit_band_coverage``: share of held-back steps inside the model's own
    90 % band (``FitReport.band_*``; 0.9 = the band matches the scatter)."""
    report = fit_mape(records, holdout_fraction)
    return {
        "fit_mape_prefill": report.mape_prefill,
        "fit_mape_decode": report.mape_decode,
        "fit_mape_floor": {"prefill": report.floor_prefill, "decode": report.floor_decode},
        "fit_band_coverage": {"prefill": report.band_prefill, "decode": report.band_decode},
    }


def to_planner_records(node_id: str, wire: list[dict]) -> list[IterationRecord]:
    return [
        IterationRecord(
            node_id=node_id,
            phase=Phase(r["phase"]),
            t=r["t"],
            batch_size=r["batch_size"],
            uncached_prompt_tokens=r["uncached_prompt_tokens"],
            cached_prompt_tokens=r["cached_prompt_tokens"],
            generated_tokens=r["generated_tokens"],
            context_tokens=r["context_tokens"],
            elapsed_ms=r["elapsed_ms"],
            attention_pairs=r.get("attention_pairs"),
            cpu_share=r.get("cpu_share"),
            host_probe_us=r.get("host_probe_us"),
        )
        for r in wire
    ]


async def _mixed_load(prefill_url: str, decode_url: str, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(5, 4000) for _ in range(rng.choice([256, 768, 1536]))] for _ in range(4)]
    async with httpx.AsyncClient(timeout=300) as client:

        async def prefill(i: int) -> None:
            prefix = rng.choice(prefixes)[: rng.choice([0, 128, 512, 1024, 1536])]
            suffix = [rng.randrange(5, 4000) for _ in range(rng.choice([32, 96, 256, 640, 1200]))]
            body = {
                "request_id": f"pl-p{i}",
                "prompt_token_ids": (prefix + suffix)[:3000],
                "role": "prefill",
                "stream": False,
                "tenant_salt": "bench",
            }
            (await client.post(prefill_url + "/internal/generate", json=body)).raise_for_status()

        async def decode(i: int, ctx: int, out: int) -> None:
            body = {
                "request_id": f"pl-d{i}",
                "prompt_token_ids": [rng.randrange(5, 4000) for _ in range(ctx)],
                "role": "decode",
                "stream": False,
                "sampling": {"max_tokens": out, "ignore_eos": True},
            }
            (await client.post(decode_url + "/internal/generate", json=body)).raise_for_status()

        async def prefills(first: int, count: int) -> None:
            # One at a time: clean single-request prefill steps of varied shape.
            for k in range(count):
                await prefill(first + k)

        n = 0
        for _ in range(rounds):
            batch = rng.choice([1, 2, 4, 8, 16, 24])
            # Decode batch, then prefills, not both at once: here the two
            # workers share one memory system, and timing one worker's steps
            # while the other computes measures that sharing, which separate
            # nodes do not have.
            await asyncio.gather(
                *[decode(n + k, rng.choice([64, 256, 1024, 2048]), rng.choice([32, 64, 128])) for k in range(batch)]
            )
            await prefills(n + batch, 8)
            n += batch + 8


def live_fit(
    model: str, rounds: int = 24, seed: int = 0, base_port: int = 8460, records_out: str | None = None
) -> dict:
    log = tempfile.mkdtemp(prefix="bench-planner-")
    run_dir = tempfile.mkdtemp(prefix="bench-planner-run-")
    # Each worker's HTTP side runs off its engine's core (the load below
    # keeps one worker computing at a time, so that core is free).
    extra = ["--run-dir", run_dir, "--http-cpus", "auto"]
    p = WorkerProcess(base_port, "prefill", model, "bp-prefill", threads_bind="0", log_path=f"{log}/p.log", extra=extra)
    d = WorkerProcess(
        base_port + 1, "decode", model, "bp-decode", threads_bind="1", log_path=f"{log}/d.log", extra=extra
    )
    try:
        p.start(), d.start()
        p.wait_ready(), d.wait_ready()
        asyncio.run(_mixed_load(p.url, d.url, rounds, seed))
        records: list[IterationRecord] = []
        for w in (p, d):
            stats = httpx.get(w.url + "/internal/stats", timeout=30).json()
            records += to_planner_records(w.node_id, stats["iterations"])
    finally:
        p.stop()
        d.stop()
    records.sort(key=lambda r: r.t)
    if records_out:
        with open(records_out, "w") as f:
            json.dump([dataclasses.asdict(r) for r in records], f)
    fit = fit_mape_from_records(records)
    return {**fit, "records": len(records)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolving-infra bench planner")
    ap.add_argument("--model", default="data/demo-model")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-port", type=int, default=8460, help="prefill worker's port; decode gets the next")
    ap.add_argument("--skip-live", action="store_true", help="only the decision-time part")
    ap.add_argument("--records-out", help="also write the live iteration records here (JSON list)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = ap.parse_args(argv)
    out: dict = {}
    if not args.skip_live:
        out.update(live_fit(args.model, args.rounds, args.seed, args.base_port, args.records_out))
    out.update(decide_bench())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
