"""Planner benchmarks: decision time at cluster scale, and model fit error.

``decide_bench`` times ``EvolvingPlanner.decide`` on synthetic clusters
(fitted profile, two minutes of mixed agent traffic) in ADVISORY mode, so
every call does the full work and none changes the planner's state.
``synthetic_records`` / ``synthetic_samples`` are seeded generators shared
with the tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from planner.evolving import EvolvingConfig, EvolvingPlanner
from planner.profile import Profile, fit_mape
from planner.types import ClusterView, IterationRecord, NodePhase, NodeState, PlannerMode, RequestSample

# Ground truth of the synthetic node: prefill (a, b, c, d), decode (a, b, c), ms.
TRUE_PREFILL = (15.0, 0.08, 0.005, 0.02)
TRUE_DECODE = (8.0, 0.3, 0.0004)


def synthetic_records(n: int, *, seed: int = 0, noise: float = 0.03, outlier_rate: float = 0.0,
                      t0: float = 0.0) -> list[IterationRecord]:
    """``n`` iteration records alternating prefill / decode, times from the
    true coefficients × (1 + N(0, noise)); a fraction ``outlier_rate`` is 3–10× slower."""
    rng = np.random.default_rng(seed)
    out: list[IterationRecord] = []
    for i in range(n):
        if i % 2 == 0:
            u, c = int(rng.integers(64, 8192)), int(rng.integers(0, 32_000))
            a, b, cc, d = TRUE_PREFILL
            ms = a + b * u + cc * c + d * u * (u + c) / 1e4
            rec = dict(phase=NodePhase.PREFILL, batch_size=int(rng.integers(1, 8)), uncached_prompt_tokens=u,
                       cached_prompt_tokens=c, generated_tokens=1, context_tokens=0)
        else:
            bsz = int(rng.integers(1, 128))
            ctx = int(bsz * rng.integers(500, 20_000))
            a, b, cc = TRUE_DECODE
            ms = a + b * bsz + cc * ctx
            rec = dict(phase=NodePhase.DECODE, batch_size=bsz, uncached_prompt_tokens=0, cached_prompt_tokens=0,
                       generated_tokens=bsz, context_tokens=ctx)
        ms *= max(1.0 + noise * rng.standard_normal(), 0.05)
        if outlier_rate and rng.random() < outlier_rate:
            ms *= rng.uniform(3.0, 10.0)
        out.append(IterationRecord(node_id=f"n{i % 7}", t=t0 + i * 0.01, elapsed_ms=float(ms), **rec))
    return out


def synthetic_samples(start: float, end: float, rate_rps: float, *, uncached: float, cached: float,
                      output: float, seed: int = 0, local_share: float = 0.0) -> list[RequestSample]:
    """Poisson arrivals in [start, end) with exponential-ish token counts
    around the given means; ``local_share`` of requests get ≤ 128 uncached tokens."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate_rps * (end - start)))
    ts = np.sort(rng.uniform(start, end, n))
    local = rng.random(n) < local_share
    u = np.where(local, rng.integers(16, 128, n), np.maximum(rng.gamma(4.0, uncached / 4.0, n), 257)).astype(int)
    c = (rng.gamma(4.0, cached / 4.0, n) if cached else np.zeros(n)).astype(int)
    o = np.maximum(rng.gamma(2.0, output / 2.0, n), 1).astype(int)
    return [RequestSample(t=float(t), uncached_prompt_tokens=int(a), cached_prompt_tokens=int(b), output_tokens=int(d))
            for t, a, b, d in zip(ts.tolist(), u.tolist(), c.tolist(), o.tolist(), strict=True)]


def synthetic_view(n_nodes: int, now: float, prefill_share: float = 0.33,
                   mode: PlannerMode = PlannerMode.ADVISORY) -> ClusterView:
    """A cluster of ``n_nodes`` with round(share·n) prefill nodes, varied load."""
    n_prefill = max(1, round(n_nodes * prefill_share))
    nodes = tuple(
        NodeState(node_id=f"node-{i:05d}", phase=NodePhase.PREFILL if i < n_prefill else NodePhase.DECODE,
                  queue=i % 5, running=(i * 7) % 32, kv_usage=((i * 13) % 100) / 100.0,
                  kv_capacity_tokens=400_000)
        for i in range(n_nodes)
    )
    return ClusterView(now=now, nodes=nodes, mode=mode)


def decide_bench(node_counts: Iterable[int] = (16, 256, 3072), repeats: int = 20) -> dict[str, dict[str, float]]:
    """Median time of one ``decide`` in ms, keyed by node count (as str):
    ``decide_ms`` wall clock (the target), ``decide_cpu_ms`` this process's
    CPU time (the same number on an idle machine; stable on a busy one)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    profile = Profile.from_records(synthetic_records(2000, seed=1))
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for n in node_counts:
        planner = EvolvingPlanner(EvolvingConfig(), profile)
        # Traffic scaled to the cluster so every size runs near the same utilisation.
        planner.observe_requests(synthetic_samples(0.0, 180.0, 0.25 * n, uncached=2000, cached=6000, output=400,
                                                   seed=2, local_share=0.3))
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
    return {"decide_ms": wall, "decide_cpu_ms": cpu}


def fit_mape_from_records(records: Iterable[IterationRecord], holdout_fraction: float = 0.3) -> dict[str, float | None]:
    """``{"fit_mape_prefill", "fit_mape_decode"}``: hold-out MAPE (fraction) of
    models fitted online on the earlier records; None where a kind is absent.
    ``fit_mape_floor``: the same error of a hindsight fit on all records
    (``FitReport.floor_*``), so a reader can tell model error from noise."""
    report = fit_mape(records, holdout_fraction)
    return {"fit_mape_prefill": report.mape_prefill, "fit_mape_decode": report.mape_decode,
            "fit_mape_floor": {"prefill": report.floor_prefill, "decode": report.floor_decode}}


if __name__ == "__main__":  # pragma: no cover - manual run
    import json

    print(json.dumps(decide_bench()))
