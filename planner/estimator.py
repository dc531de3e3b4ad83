"""Predicted throughput, TTFT and TPOT of every P/D split; switch cost.

Pure numpy over a fitted ``Profile`` and a ``WorkloadEstimate``. Units:
seconds and requests per second unless a name says ``_ms``.

Model of a split with P prefill and D = N − P decode nodes, offered rate λ
(requests counted at arrival when known, else completions):

- A fraction f of requests is *local* (uncached ≤ the router threshold): it
  runs entirely on a decode node, its prompt costing ``s_loc`` decode-node
  seconds. The rest is *remote*: prefill node, then decode node.
- Prefill, per remote prompt at saturation (iterations full to the token
  budget B): ``s = (a·max(u/B, 1/k_max) + b·u + c·cached + d·E[pairs]/1e4)
  / 1000`` where pairs = Σ over the prompt's chunks of n·(n + context
  before it) = u·c + u·(u + min(u, B))/2, averaged over requests (the
  workload keeps E[pairs]: attention is convex in u, so a mean prompt
  under-states it at long contexts). Prefill capacity = P / ((1 − f)·s).
- Decode nodes: iteration ``t_d(B) = a + b·B + c·B·ctx``. A request holds
  its KV for o iterations, so the running batch is length-biased: ctx =
  E[o·(prompt + o/2)] / E[o] and KV per request E[o·(prompt + r·o)] / E[o]
  with r = ``kv_output_reserved`` (0.5: KV grows with the output; 1: the
  output is reserved at admission). Batch ceiling B_max = min(max batch,
  usable KV / KV per request). By Little's law a node with arrival rate
  λ/D keeps ``B = (λ/D)·O·t_d(B)/(1 − ρ_loc)`` requests running, ρ_loc =
  λ·f·s_loc/D; solved in closed form (t_d is linear in B). Decode capacity
  = D·B_max / (O·t_d(B_max) + B_max·f·s_loc). Local prompts that join the
  same decode iteration share its prefill intercept: with m of them per
  iteration on average (Poisson), one costs (1 − e^(−m))/m of an intercept
  in s_loc; m = f·B_max/O at saturation (the node iterates back to back
  and B_max/O requests join each iteration), f·(λ/D)·TPOT below it (a
  fixed point: TPOT depends on ρ_loc). Charging every local prompt a whole
  intercept put 7P2D at 251 req/s on Azure's code trace at 3x load, where
  the simulator served 290 with the prefill nodes the bottleneck.
- ``capacity = min(prefill, decode)``: the sustainable request rate.
- Queues (M/G/c, Allen–Cunneen with Sakasegawa's P(wait) = ρ^(√(2(c+1))−1);
  c = 1 is Pollaczek–Khinchine): the prefill nodes are one queue of P
  servers at ρ = λ(1 − f)s/P (the router sends a prompt to a least-loaded
  node), service variability from the spread of uncached tokens; P95 wait =
  θ·ln(P(wait)/0.05), θ the mean wait of one that waits. A decode slot
  (D·B_max of them, held O·t_d(B_max)) adds its wait near saturation.
- TTFT (P95, remote): P95 wait + the prompt's own iterations (a P95-sized
  prompt: ⌈u95/B⌉ intercepts, its tokens and chunked attention, plus the
  batch-mates that arrived during one iteration). Local-only: s_loc + TPOT.
- TPOT = t_d(B) / (1 − ρ_loc) at the steady-state batch.
- Served throughput (``served_rps``, what the planner maximises): open-loop
  arrivals (requests with no known gap) at their rate, plus a closed loop
  of N = X_obs·(Z + R_obs) agents (Little's law: gap Z, response R) that
  sends N / (Z + R(X)); X solves X = open + N/(Z + R(X)), at most
  capacity. More capacity serves no more of an open loop that fits, and a
  closed loop only through shorter responses: both are in X.
  ``response_s`` is the mean response time at X.
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

from planner._split_math import UNSTABLE_S, evaluate, fixed_terms, scenarios, sd, served
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
    capacity, and its standard deviation; ``served_*``: the same for the
    throughput of the offered load; ``*_sd*`` are 0 without uncertainty.
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
    e2e_s: np.ndarray  # mean response time at the offered rate (mean TTFT + output x TPOT)
    e2e_sd_s: np.ndarray
    decode_batch: np.ndarray
    feasible: np.ndarray
    gain_rps: np.ndarray
    gain_sd_rps: np.ndarray
    served_rps: np.ndarray  # throughput of the offered load on this split
    served_sd_rps: np.ndarray
    served_gain_sd_rps: np.ndarray  # sd of served_rps minus the reference's
    response_s: np.ndarray  # mean response time at served_rps
    response_sd_s: np.ndarray
    reference_prefill: int
    reference_prefill_capacity_rps: float
    reference_decode_capacity_rps: float
    reference_served_rps: float

    def index(self, prefill: int) -> int:
        """Position of split ``prefill`` in the arrays (ValueError if absent)."""
        hits = np.flatnonzero(self.prefill_nodes == prefill)
        if hits.size == 0:
            raise ValueError(f"split with {prefill} prefill nodes not estimated")
        return int(hits[0])


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, 0.0)


def _run(
    profile: Profile,
    workloads: list[WorkloadEstimate],
    p_arr: np.ndarray,
    total_nodes: int,
    reference: int,
    slo: SLO,
    kv: float,
    config: EstimatorConfig,
    with_uncertainty: bool,
) -> list[SplitEstimate]:
    sc = scenarios(profile, workloads, with_uncertainty, config.prefill_token_budget)
    splits = np.append(p_arr, reference)
    fx = fixed_terms(sc, splits, total_nodes, kv, config)
    r = evaluate(sc, fx, slo)
    x, resp = served(sc, fx)
    cap, xf = _finite(r["cap"]), _finite(x)
    zeros = np.zeros(p_arr.size)
    if with_uncertainty:
        sds = {
            "capacity_sd_rps": sd(cap)[:-1],
            "gain_sd_rps": sd(cap[:, :-1] - cap[:, -1:]),
            "ttft_sd_s": sd(r["ttft"])[:-1],
            "tpot_sd_s": sd(r["tpot"])[:-1],
            "e2e_sd_s": sd(r["e2e"])[:-1],
            "served_sd_rps": sd(xf)[:-1],
            "served_gain_sd_rps": sd(xf[:, :-1] - xf[:, -1:]),
            "response_sd_s": sd(resp)[:-1],
        }
        rows = [0]
    else:
        sds = dict.fromkeys(SD_FIELDS, zeros)
        rows = list(range(len(workloads)))
    return [
        SplitEstimate(
            prefill_nodes=p_arr,
            decode_nodes=total_nodes - p_arr,
            capacity_rps=r["cap"][i, :-1],
            prefill_capacity_rps=r["pre_cap"][i, :-1],
            decode_capacity_rps=r["dec_cap"][i, :-1],
            tokens_per_s=r["tokens"][i, :-1],
            ttft_s=r["ttft"][i, :-1],
            tpot_s=r["tpot"][i, :-1],
            e2e_s=r["e2e"][i, :-1],
            decode_batch=r["batch"][i, :-1],
            feasible=r["feasible"][i, :-1],
            gain_rps=cap[i, :-1] - cap[i, -1],
            served_rps=x[i, :-1],
            response_s=resp[i, :-1],
            reference_prefill=reference,
            reference_prefill_capacity_rps=float(r["pre_cap"][i, -1]),
            reference_decode_capacity_rps=float(r["dec_cap"][i, -1]),
            reference_served_rps=float(x[i, -1]),
            **sds,
        )
        for i in rows
    ]


SD_FIELDS = (
    "capacity_sd_rps",
    "gain_sd_rps",
    "ttft_sd_s",
    "tpot_sd_s",
    "e2e_sd_s",
    "served_sd_rps",
    "served_gain_sd_rps",
    "response_sd_s",
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
    its gains over the ``reference_prefill`` split (usually current).

    ``kv_capacity_tokens``: KV tokens of one decode node; ≤ 0 = unknown, then
    only ``max_decode_batch`` bounds the batch.
    """
    p_arr = _check(total_nodes, prefill_nodes, reference_prefill)
    args = (p_arr, total_nodes, reference_prefill, slo, kv_capacity_tokens, config, with_uncertainty)
    return _run(profile, [workload], *args)[0]


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
    return _run(profile, workloads, p_arr, total_nodes, reference_prefill, slo, kv_capacity_tokens, config, False)


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
    """SplitPrediction per split: throughput = served throughput of the
    offered load, bounds ∓ z·sd (lower ≥ 0); capacity beside it."""
    x = est.served_rps
    lo = np.maximum(x - z * est.served_sd_rps, 0.0)
    hi = x + z * est.served_sd_rps
    cols = zip(
        est.prefill_nodes.tolist(),
        est.decode_nodes.tolist(),
        x.tolist(),
        lo.tolist(),
        hi.tolist(),
        est.tokens_per_s.tolist(),
        est.ttft_s.tolist(),
        est.tpot_s.tolist(),
        est.feasible.tolist(),
        node_seconds.tolist(),
        np.minimum(est.capacity_rps, 1e18).tolist(),
        est.response_s.tolist(),
        strict=True,
    )
    return tuple(SplitPrediction(*row) for row in cols)
