"""Synthetic planner inputs shared by tests and benchmarks: iteration records
from known coefficients, Poisson request samples, cluster views. Seeded."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from core import Phase
from planner.estimator import SplitEstimate
from planner.types import ClusterView, IterationRecord, NodeState, PlannerMode, RequestSample

# Ground truth of the synthetic node: prefill (a, b, c, d), decode (a, b, c), ms.
TRUE_PREFILL = (15.0, 0.08, 0.005, 0.02)
TRUE_DECODE = (8.0, 0.3, 0.0004)


def synthetic_records(
    n: int, *, seed: int = 0, noise: float = 0.03, outlier_rate: float = 0.0, t0: float = 0.0
) -> list[IterationRecord]:
    """``n`` iteration records alternating prefill / decode, times from the
    true coefficients × (1 + N(0, noise)); a fraction ``outlier_rate`` is 3–10× slower."""
    rng = np.random.default_rng(seed)
    out: list[IterationRecord] = []
    for i in range(n):
        if i % 2 == 0:
            u, c = int(rng.integers(64, 8192)), int(rng.integers(0, 32_000))
            a, b, cc, d = TRUE_PREFILL
            ms = a + b * u + cc * c + d * u * (u + c) / 1e4
            rec: dict[str, Any] = {
                "phase": Phase.PREFILL,
                "batch_size": int(rng.integers(1, 8)),
                "uncached_prompt_tokens": u,
                "cached_prompt_tokens": c,
                "generated_tokens": 1,
                "context_tokens": 0,
            }
        else:
            bsz = int(rng.integers(1, 128))
            ctx = int(bsz * rng.integers(500, 20_000))
            a, b, cc = TRUE_DECODE
            ms = a + b * bsz + cc * ctx
            rec = {
                "phase": Phase.DECODE,
                "batch_size": bsz,
                "uncached_prompt_tokens": 0,
                "cached_prompt_tokens": 0,
                "generated_tokens": bsz,
                "context_tokens": ctx,
            }
        ms *= max(1.0 + noise * rng.standard_normal(), 0.05)
        if outlier_rate and rng.random() < outlier_rate:
            ms *= rng.uniform(3.0, 10.0)
        out.append(IterationRecord(node_id=f"n{i % 7}", t=t0 + i * 0.01, elapsed_ms=float(ms), **rec))
    return out


def synthetic_samples(
    start: float,
    end: float,
    rate_rps: float,
    *,
    uncached: float,
    cached: float,
    output: float,
    seed: int = 0,
    local_share: float = 0.0,
) -> list[RequestSample]:
    """Poisson arrivals in [start, end) with exponential-ish token counts
    around the given means; ``local_share`` of requests get ≤ 128 uncached tokens."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate_rps * (end - start)))
    ts = np.sort(rng.uniform(start, end, n))
    local = rng.random(n) < local_share
    u = np.where(local, rng.integers(16, 128, n), np.maximum(rng.gamma(4.0, uncached / 4.0, n), 257)).astype(int)
    c = (rng.gamma(4.0, cached / 4.0, n) if cached else np.zeros(n)).astype(int)
    o = np.maximum(rng.gamma(2.0, output / 2.0, n), 1).astype(int)
    return [
        RequestSample(t=float(t), uncached_prompt_tokens=int(a), cached_prompt_tokens=int(b), output_tokens=int(d))
        for t, a, b, d in zip(ts.tolist(), u.tolist(), c.tolist(), o.tolist(), strict=True)
    ]


def closed_loop(
    samples: list[RequestSample], share: float, *, think_s: float, e2e_s: float, seed: int = 0
) -> list[RequestSample]:
    """``samples`` with ``share`` of them turned into agent turns: each
    carries the think time before it (exponential around ``think_s``) and
    its response time (``e2e_s``), as a branch's later turns do; the rest
    are left as they are (open-loop arrivals)."""
    rng = np.random.default_rng(seed)
    turn = rng.random(len(samples)) < share
    gaps = rng.exponential(think_s, len(samples))
    return [
        dataclasses.replace(s, gap_s=float(g), e2e_s=e2e_s) if closed else s
        for s, closed, g in zip(samples, turn.tolist(), gaps.tolist(), strict=True)
    ]


def synthetic_view(
    n_nodes: int, now: float, prefill_share: float = 0.33, mode: PlannerMode = PlannerMode.ADVISORY
) -> ClusterView:
    """A cluster of ``n_nodes`` with round(share·n) prefill nodes, varied load."""
    n_prefill = max(1, round(n_nodes * prefill_share))
    nodes = tuple(
        NodeState(
            node_id=f"node-{i:05d}",
            phase=Phase.PREFILL if i < n_prefill else Phase.DECODE,
            queue=i % 5,
            running=(i * 7) % 32,
            kv_usage=((i * 13) % 100) / 100.0,
            kv_capacity_tokens=400_000,
        )
        for i in range(n_nodes)
    )
    return ClusterView(now=now, nodes=nodes, mode=mode)


def literal_estimate(prefill: list[int], total: int = 4, **arrays: list[float]) -> SplitEstimate:
    """A `SplitEstimate` over the `prefill` splits from literal arrays (unnamed
    ones are zeros; every split feasible; the first split is the reference)."""

    def arr(name: str) -> np.ndarray:
        return np.array(arrays.get(name, [0.0] * len(prefill)), dtype=float)

    p = np.array(prefill)
    served = arr("served_rps")
    return SplitEstimate(
        prefill_nodes=p,
        decode_nodes=total - p,
        capacity_rps=arr("capacity_rps"),
        capacity_sd_rps=arr("capacity_sd_rps"),
        prefill_capacity_rps=arr("prefill_capacity_rps"),
        decode_capacity_rps=arr("decode_capacity_rps"),
        tokens_per_s=arr("tokens_per_s"),
        ttft_s=arr("ttft_s"),
        tpot_s=arr("tpot_s"),
        ttft_sd_s=arr("ttft_sd_s"),
        tpot_sd_s=arr("tpot_sd_s"),
        e2e_s=arr("e2e_s"),
        e2e_sd_s=arr("e2e_sd_s"),
        decode_batch=arr("decode_batch"),
        feasible=np.ones(len(prefill), dtype=bool),
        gain_rps=arr("gain_rps"),
        gain_sd_rps=arr("gain_sd_rps"),
        served_rps=served,
        served_sd_rps=arr("served_sd_rps"),
        served_gain_sd_rps=arr("served_gain_sd_rps"),
        response_s=arr("response_s"),
        response_sd_s=arr("response_sd_s"),
        reference_prefill=prefill[0],
        reference_prefill_capacity_rps=0.0,
        reference_decode_capacity_rps=0.0,
        reference_served_rps=float(served[0]) if len(served) else 0.0,
    )
