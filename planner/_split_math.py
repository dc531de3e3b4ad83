"""The vectorised split model behind ``planner.estimator`` (formulas in its doc).

``scenarios`` builds input rows (J × k): one per workload, or a base row plus
± one-sigma perturbations; ``evaluate`` computes every output for every row
and split (J × S); ``sd`` turns perturbation rows into delta-method standard
deviations. Private: import ``planner.estimator`` instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from planner.estimator_config import EstimatorConfig
from planner.types import SLO
from planner.workload import WorkloadEstimate

if TYPE_CHECKING:
    from planner.profile import Profile

UNSTABLE_S = 1e6  # reported TTFT/TPOT of a queue that never drains
_EPS = 1e-12


_W_COLS = ("u", "c", "o", "f", "rate", "cs2", "ul", "cl", "u95")


def workload_row(w: WorkloadEstimate) -> np.ndarray:
    cs2 = (w.remote_uncached_std / max(w.remote_uncached_mean, 1.0)) ** 2
    u95 = w.remote_uncached_mean + 1.645 * w.remote_uncached_std
    return np.array(
        [
            w.remote_uncached_mean,
            w.remote_cached_mean,
            w.output_mean,
            w.local_fraction,
            w.rate_rps,
            cs2,
            w.local_uncached_mean,
            w.local_cached_mean,
            u95,
        ],
        dtype=float,
    )


def scenarios(profile: Profile, workloads: list[WorkloadEstimate], with_uncertainty: bool) -> dict[str, np.ndarray]:
    """Rows (J × k) of inputs: one per workload, or for a single workload the
    base plus ± one-sigma perturbations of every uncertain input."""
    p0, d0 = profile.prefill.rls.theta, profile.decode.rls.theta
    rows_w = [workload_row(w) for w in workloads]
    rows_p, rows_d = [p0] * len(rows_w), [d0] * len(rows_w)
    if with_uncertainty:
        w = workloads[0]
        n, nr, f = max(w.n, 1), max(w.n_remote, 1), w.local_fraction
        w_se = [
            w.remote_uncached_std / math.sqrt(nr),
            w.remote_cached_std / math.sqrt(nr),
            w.output_std / math.sqrt(n),
            math.sqrt(f * (1 - f) / n),
        ]
        deltas: list[tuple[int, np.ndarray]] = []
        for key, model in enumerate((profile.prefill.rls, profile.decode.rls)):
            vals, vecs = np.linalg.eigh(model.param_cov)
            deltas += [(key, vecs[:, i] * math.sqrt(max(v, 0.0))) for i, v in enumerate(vals)]
        deltas += [(2, np.eye(len(_W_COLS))[i] * se) for i, se in enumerate(w_se)]
        for key, delta in deltas:
            for sign in (1.0, -1.0):
                rows_p.append(p0 + sign * delta if key == 0 else p0)
                rows_d.append(d0 + sign * delta if key == 1 else d0)
                rows_w.append(rows_w[0] + sign * delta if key == 2 else rows_w[0])
    wcols = np.maximum(np.stack(rows_w), 0.0)
    wcols[:, 3] = np.minimum(wcols[:, 3], 1.0)
    return {"p": np.stack(rows_p), "d": np.stack(rows_d), "w": wcols}


def evaluate(
    sc: dict[str, np.ndarray], p_nodes: np.ndarray, n_nodes: int, kv_tokens: float, cfg: EstimatorConfig, slo: SLO
) -> dict[str, np.ndarray]:
    def col(a: np.ndarray, i: int) -> np.ndarray:  # one column, kept 2-D (J × 1)
        return a[:, i : i + 1]

    ap, bp, cp, dp = (col(sc["p"], i) for i in range(4))
    ad, bd, cd = (col(sc["d"], i) for i in range(3))
    u, c, out_tokens, f, lam, cs2, ul, cl, u95 = (col(sc["w"], i) for i in range(len(_W_COLS)))
    o = np.maximum(out_tokens, 1.0)
    P = p_nodes[None, :].astype(float)
    D = n_nodes - P
    k = np.clip(np.floor(cfg.prefill_token_budget / np.maximum(u, 1.0)), 1, cfg.max_prefill_batch)
    # k prompts per iteration: attention is per prompt, k·u·(u+c), not (k·u)·(k·u+k·c)
    batch_ms = np.maximum(ap + bp * k * u + cp * k * c + dp * k * u * (u + c) / 1e4, _EPS)
    s_req = batch_ms / k / 1000.0
    s_loc = np.where(f > 0, np.maximum(ap + bp * ul + cp * cl + dp * ul * (ul + cl) / 1e4, 0.0) / 1000.0, 0.0)
    ctx = (1.0 - f) * (u + c) + f * (ul + cl) + o / 2.0
    # With no prefill node the router runs every request on a decode node
    # (routing.picker: "no separate prefill node"): all traffic is local
    # there, long prompts one at a time (`local_split`).
    none = P == 0
    s_one = np.maximum(ap + bp * u + cp * c + dp * u * (u + c) / 1e4, 0.0) / 1000.0  # one long prompt alone
    loc_work = np.where(none, f * s_loc + (1.0 - f) * s_one, f * s_loc)  # decode-node prefill s per request
    f = np.where(none, 1.0, f)
    rf = 1.0 - f
    b_max = np.full_like(ctx, float(cfg.max_decode_batch))
    if kv_tokens > 0:
        b_max = np.maximum(np.minimum(b_max, kv_tokens * cfg.kv_usable_fraction / np.maximum(ctx, 1.0)), 1.0)
    # A decode step costs at least its fixed part: a fit whose slopes came out
    # negative (collinear batch and context) must not predict free steps.
    step_floor = np.maximum(ad, _EPS)
    td_max = np.maximum(ad + bd * b_max + cd * b_max * ctx, step_floor) / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        pre_cap = np.where(rf > 1e-9, P / np.maximum(rf * s_req, _EPS), np.inf)
        dec_cap = D * b_max / (o * td_max + b_max * loc_work)
        cap = np.minimum(pre_cap, dec_cap)
        served = np.minimum(lam, cap)
        rho_loc = np.where(D > 0, served * loc_work / np.maximum(D, 1.0), 1.0)
        lam_d = served / np.maximum(D, 1.0)
        denom = (1.0 - rho_loc) - lam_d * o * (bd + cd * ctx) / 1000.0
        batch = np.where(denom > 0, lam_d * o * ad / 1000.0 / np.maximum(denom, _EPS), b_max)
        batch = np.minimum(batch, b_max)
        tpot = np.maximum(ad + bd * batch + cd * batch * ctx, step_floor) / 1000.0 / np.maximum(1.0 - rho_loc, _EPS)
        tpot = np.where((D > 0) & (rho_loc < 1.0), tpot, UNSTABLE_S)
        rho = np.where(P > 0, lam * rf * s_req / np.maximum(P, 1.0), np.inf)
        wq = rho * s_req * (1.0 + cs2) / (2.0 * (1.0 - rho))
        wq95 = np.where(20.0 * rho > 1.0, wq * np.log(np.maximum(20.0 * rho, 1.0)) / np.maximum(rho, _EPS), 0.0)
        # Own iteration: the batch holds what arrived during one full-batch
        # iteration (ρ·k requests), at least this one, at most k.
        ke = np.clip(np.nan_to_num(rho * k, posinf=1e9), 1.0, k)
        own_ms = ap + (bp * u + cp * c + dp * u * (u + c) / 1e4) * ke  # attention per prompt, as above
        own = np.maximum(own_ms, _EPS) / 1000.0 * np.maximum(1.0, np.ceil(u95 / cfg.prefill_token_budget))
        ttft_remote = np.where(rho < 1.0, wq95 + own, UNSTABLE_S)
        ttft_local = np.minimum(s_loc + tpot, UNSTABLE_S)
        ttft_local_mean = s_loc + tpot
        # No prefill node: prompts queue for the decode nodes' prefill work (M/G/1 at ρ_loc).
        solo, solo_mean = local_split(rho_loc, loc_work, cs2, tpot)
        ttft_local = np.where(none, solo, ttft_local)
        ttft_local_mean = np.where(none, solo_mean, ttft_local_mean)
        ttft = np.where(rf >= 0.05, ttft_remote, ttft_local)
        # Mean response time: mean wait (not P95) + own iteration, then o tokens at TPOT.
        ttft_mean = np.where(rf >= 0.05, np.where(rho < 1.0, wq + own, UNSTABLE_S), ttft_local_mean)
        e2e = np.minimum(ttft_mean + o * tpot, UNSTABLE_S)
    kv_ok = (kv_tokens <= 0) | (kv_tokens * cfg.kv_usable_fraction >= ctx + o / 2.0)
    feasible = (lam <= cap) & (ttft <= slo.ttft_s) & (tpot <= slo.tpot_s) & kv_ok & (D > 0)
    return {
        "cap": cap,
        "pre_cap": pre_cap,
        "dec_cap": dec_cap,
        "ttft": ttft,
        "tpot": tpot,
        "e2e": e2e,
        "batch": batch,
        "feasible": feasible,
        "tokens": cap * out_tokens,
    }


def local_split(
    rho_loc: np.ndarray, work_s: np.ndarray, cs2: np.ndarray, tpot: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(P95, mean) TTFT on a split without prefill nodes: each decode node
    also computes every prompt routed to it, `work_s` seconds per request
    at utilisation `rho_loc` of that work, queued as an M/G/1 (Pollaczek–
    Khinchine wait, exponential tail as for prefill nodes), then the own
    prompt and one decode step."""
    stable = rho_loc < 1.0
    rho = np.clip(rho_loc, 0.0, 1.0 - 1e-9)
    wq = rho * work_s * (1.0 + cs2) / (2.0 * (1.0 - rho))
    wq95 = np.where(20.0 * rho > 1.0, wq * np.log(np.maximum(20.0 * rho, 1.0)) / np.maximum(rho, _EPS), 0.0)
    p95 = np.where(stable, np.minimum(wq95 + work_s + tpot, UNSTABLE_S), UNSTABLE_S)
    mean = np.where(stable, np.minimum(wq + work_s + tpot, UNSTABLE_S), UNSTABLE_S)
    return p95, mean


def sd(x: np.ndarray) -> np.ndarray:
    """Delta-method sd from rows [base, +δ1, −δ1, +δ2, −δ2, …]."""
    if x.shape[0] == 1:
        return np.zeros(x.shape[1])
    diff = (x[1::2] - x[2::2]) / 2.0
    return np.sqrt(np.sum(np.nan_to_num(diff, posinf=0.0, neginf=0.0) ** 2, axis=0))
