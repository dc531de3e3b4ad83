"""Predicted throughput, TTFT and TPOT of every P/D split; switch cost.

Pure numpy over a fitted ``Profile`` and a ``WorkloadEstimate``. Units:
seconds and requests per second unless a name says ``_ms``.

Model of a split with P prefill and D = N − P decode nodes, offered rate λ:

- A fraction f of requests is *local* (uncached ≤ the router threshold): it
  runs entirely on a decode node, its prompt costing ``s_loc`` decode-node
  seconds. The rest is *remote*: prefill node, then decode node.
- Prefill nodes batch k = clamp(budget // u, 1, max_prefill_batch) remote
  prompts per iteration; per-request service ``s = t_p(k·u, k·c) / k``.
  Prefill capacity = P / ((1 − f)·s).
- Decode nodes: iteration ``t_d(B) = a + b·B + c·B·ctx`` with ctx = mean
  prompt + output/2 (mean KV per running request). Batch ceiling B_max =
  min(max_decode_batch, usable KV tokens / ctx). By Little's law a node with
  arrival rate λ/D keeps ``B = (λ/D)·O·t_d(B)/(1 − ρ_loc)`` requests running,
  ρ_loc = λ·f·s_loc/D; solved in closed form (t_d is linear in B).
  Decode capacity = D·B_max / (O·t_d(B_max) + B_max·f·s_loc).
- ``capacity = min(prefill, decode)``: the sustainable request rate under the
  current mix. It is reported as ``throughput_rps`` (served = min(λ, it)).
- TTFT (P95, remote requests): each prefill node as an M/G/1 queue at
  ρ = λ(1 − f)s/P, Pollaczek–Khinchine mean wait with service variability
  from the spread of uncached tokens, the exponential tail's P95
  ``Wq·ln(20ρ)/ρ``, plus the request's own iteration (a batch of the ρ·k
  requests arriving during a full-batch iteration, ≥ 1; several when a P95
  prompt exceeds the token budget). Local-only traffic: s_loc + TPOT.
- TPOT = t_d(B) / (1 − ρ_loc) at the steady-state batch.
- Saturated queues report ``UNSTABLE_S`` instead of infinity (JSON-safe).

Uncertainty: the model is re-evaluated with each coefficient eigen-direction
(parameter covariance, not per-iteration noise) and each workload mean
(± its standard error) moved by one standard deviation; the finite
differences give a delta-method standard deviation of every output and of
the *gain* between splits, where errors shared by both splits cancel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner._split_math import UNSTABLE_S, evaluate, scenarios, sd
from planner.estimator_config import EstimatorConfig
from planner.profile import Profile
from planner.types import SLO, SplitPrediction
from planner.workload import WorkloadEstimate

__all__ = [
    "UNSTABLE_S",
    "EstimatorConfig",
    "SplitEstimate",
    "SwitchCost",
    "estimate_many",
    "estimate_splits",
    "switch_cost",
    "switch_costs",
    "to_predictions",
]


@dataclass(frozen=True)
class SplitEstimate:
    """Per-split predictions, arrays aligned with ``prefill_nodes``.

    ``gain_rps`` / ``gain_sd_rps``: capacity minus the reference split's
    capacity, and its standard deviation; ``*_sd*`` are 0 without uncertainty.
    """

    prefill_nodes: np.ndarray
    decode_nodes: np.ndarray
    capacity_rps: np.ndarray
    capacity_sd_rps: np.ndarray
    prefill_capacity_rps: np.ndarray
    decode_capacity_rps: np.ndarray
    tokens_per_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    ttft_sd_s: np.ndarray
    tpot_sd_s: np.ndarray
    e2e_s: np.ndarray  # mean response time (mean TTFT + output x TPOT)
    e2e_sd_s: np.ndarray
    decode_batch: np.ndarray
    feasible: np.ndarray
    gain_rps: np.ndarray
    gain_sd_rps: np.ndarray
    reference_prefill: int
    reference_prefill_capacity_rps: float
    reference_decode_capacity_rps: float

    def index(self, prefill: int) -> int:
        """Position of split ``prefill`` in the arrays (ValueError if absent)."""
        hits = np.flatnonzero(self.prefill_nodes == prefill)
        if hits.size == 0:
            raise ValueError(f"split with {prefill} prefill nodes not estimated")
        return int(hits[0])


def _split_estimate(
    r: dict[str, np.ndarray],
    row: int,
    p_arr: np.ndarray,
    total_nodes: int,
    reference: int,
    gain_sd: np.ndarray,
    cap_sd: np.ndarray,
    ttft_sd: np.ndarray,
    tpot_sd: np.ndarray,
    e2e_sd: np.ndarray,
) -> SplitEstimate:
    cap = r["cap"][row]
    finite = np.where(np.isfinite(cap), cap, 0.0)
    return SplitEstimate(
        prefill_nodes=p_arr,
        decode_nodes=total_nodes - p_arr,
        capacity_rps=cap[:-1],
        capacity_sd_rps=cap_sd,
        prefill_capacity_rps=r["pre_cap"][row, :-1],
        decode_capacity_rps=r["dec_cap"][row, :-1],
        tokens_per_s=r["tokens"][row, :-1],
        ttft_s=r["ttft"][row, :-1],
        tpot_s=r["tpot"][row, :-1],
        ttft_sd_s=ttft_sd,
        tpot_sd_s=tpot_sd,
        e2e_s=r["e2e"][row, :-1],
        e2e_sd_s=e2e_sd,
        decode_batch=r["batch"][row, :-1],
        feasible=r["feasible"][row, :-1],
        gain_rps=finite[:-1] - finite[-1],
        gain_sd_rps=gain_sd,
        reference_prefill=reference,
        reference_prefill_capacity_rps=float(r["pre_cap"][row, -1]),
        reference_decode_capacity_rps=float(r["dec_cap"][row, -1]),
    )


def _check(total_nodes: int, prefill_nodes: Any, reference_prefill: int) -> np.ndarray:
    p_arr = np.asarray(prefill_nodes, dtype=np.int64).ravel()
    if total_nodes < 1 or (p_arr < 0).any() or (p_arr > total_nodes).any():
        raise ValueError("need total_nodes >= 1 and every split in [0, total_nodes]")
    if not 0 <= reference_prefill <= total_nodes:
        raise ValueError("reference_prefill out of range")
    return p_arr


def estimate_splits(
    profile: Profile,
    workload: WorkloadEstimate,
    total_nodes: int,
    prefill_nodes: Any,
    *,
    reference_prefill: int,
    slo: SLO = SLO(),
    kv_capacity_tokens: float = 0.0,
    config: EstimatorConfig = EstimatorConfig(),
    with_uncertainty: bool = True,
) -> SplitEstimate:
    """Predict every split in ``prefill_nodes`` (each in [0, total_nodes]) and
    its capacity gain over the ``reference_prefill`` split (usually current).

    ``kv_capacity_tokens``: KV tokens of one decode node; ≤ 0 = unknown, then
    only ``max_decode_batch`` bounds the batch.
    """
    p_arr = _check(total_nodes, prefill_nodes, reference_prefill)
    sc = scenarios(profile, [workload], with_uncertainty)
    r = evaluate(sc, np.append(p_arr, reference_prefill), total_nodes, kv_capacity_tokens, config, slo)
    finite = np.where(np.isfinite(r["cap"]), r["cap"], 0.0)
    return _split_estimate(
        r,
        0,
        p_arr,
        total_nodes,
        reference_prefill,
        sd(finite[:, :-1] - finite[:, -1:]),
        sd(finite)[:-1],
        sd(r["ttft"])[:-1],
        sd(r["tpot"])[:-1],
        sd(r["e2e"])[:-1],
    )


def estimate_many(
    profile: Profile,
    workloads: list[WorkloadEstimate],
    total_nodes: int,
    prefill_nodes: Any,
    *,
    reference_prefill: int,
    slo: SLO = SLO(),
    kv_capacity_tokens: float = 0.0,
    config: EstimatorConfig = EstimatorConfig(),
) -> list[SplitEstimate]:
    """``estimate_splits`` without uncertainty for several workloads at once
    (one vectorised pass; used for the persistence sub-windows)."""
    p_arr = _check(total_nodes, prefill_nodes, reference_prefill)
    if not workloads:
        return []
    sc = scenarios(profile, workloads, with_uncertainty=False)
    r = evaluate(sc, np.append(p_arr, reference_prefill), total_nodes, kv_capacity_tokens, config, slo)
    zeros = np.zeros(p_arr.size)
    return [
        _split_estimate(r, i, p_arr, total_nodes, reference_prefill, zeros, zeros, zeros, zeros, zeros)
        for i in range(len(workloads))
    ]


@dataclass(frozen=True)
class SwitchCost:
    """nodes_moved; node_seconds out of service; lost_requests: node_seconds ×
    the donor side's per-node capacity at the current split (requests)."""

    nodes_moved: int
    node_seconds: float
    lost_requests: float


def switch_costs(
    est: SplitEstimate, current_prefill: int, total_nodes: int, config: EstimatorConfig = EstimatorConfig()
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised (node_seconds, lost_requests) of moving from
    ``current_prefill`` to each split in ``est`` (its reference must be the
    current split)."""
    current_decode = total_nodes - current_prefill
    delta = est.prefill_nodes - current_prefill
    per_prefill = est.reference_prefill_capacity_rps / current_prefill if current_prefill else 0.0
    per_decode = est.reference_decode_capacity_rps / current_decode if current_decode else 0.0
    per_prefill = per_prefill if math.isfinite(per_prefill) else 0.0
    seconds = np.where(delta > 0, delta * config.switch_to_prefill_s, -delta * config.switch_to_decode_s)
    lost = np.where(delta > 0, seconds * per_decode, seconds * per_prefill)
    return seconds.astype(float), lost.astype(float)


def switch_cost(
    est: SplitEstimate,
    current_prefill: int,
    target_prefill: int,
    total_nodes: int,
    config: EstimatorConfig = EstimatorConfig(),
) -> SwitchCost:
    """Cost of moving from ``current_prefill`` to ``target_prefill``."""
    seconds, lost = switch_costs(est, current_prefill, total_nodes, config)
    i = est.index(target_prefill)
    return SwitchCost(abs(target_prefill - current_prefill), float(seconds[i]), float(lost[i]))


def to_predictions(est: SplitEstimate, node_seconds: np.ndarray, z: float) -> tuple[SplitPrediction, ...]:
    """SplitPrediction per split, bounds = capacity ∓ z·sd (lower ≥ 0)."""
    cap = est.capacity_rps
    lo = np.maximum(cap - z * est.capacity_sd_rps, 0.0)
    hi = cap + z * est.capacity_sd_rps
    cols = zip(
        est.prefill_nodes.tolist(),
        est.decode_nodes.tolist(),
        cap.tolist(),
        lo.tolist(),
        hi.tolist(),
        est.tokens_per_s.tolist(),
        est.ttft_s.tolist(),
        est.tpot_s.tolist(),
        est.feasible.tolist(),
        node_seconds.tolist(),
        strict=True,
    )
    return tuple(SplitPrediction(*row) for row in cols)
