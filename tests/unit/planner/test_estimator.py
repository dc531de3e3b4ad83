"""Split predictions against hand-computed values, uncertainty, switch cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.estimator import EstimatorConfig, estimate_splits, switch_cost, to_predictions
from planner.profile import Profile
from planner.types import SLO
from planner.workload import WorkloadEstimate
from testing.planner_records import synthetic_records


def _workload(
    rate: float, u: float, c: float, o: float, f: float = 0.0, ul: float = 0.0, cl: float = 0.0, n: int = 1000
) -> WorkloadEstimate:
    """Token spreads 0, so no queueing variability term (cs² = 0)."""
    return WorkloadEstimate(
        window_s=60.0,
        n=n,
        rate_rps=rate,
        uncached_mean=(1 - f) * u + f * ul,
        uncached_std=0.0,
        cached_mean=(1 - f) * c + f * cl,
        cached_std=0.0,
        output_mean=o,
        output_std=0.0,
        local_fraction=f,
        n_remote=int(n * (1 - f)),
        remote_uncached_mean=u,
        remote_uncached_std=0.0,
        remote_cached_mean=c,
        remote_cached_std=0.0,
        local_uncached_mean=ul,
        local_cached_mean=cl,
    )


def test_hand_computed_remote_only() -> None:
    # prefill t = 10 + 0.1·u ms; decode t = 5 + 1·B ms; 2,000-token batches.
    profile = Profile.from_coefficients((10.0, 0.1, 0.0, 0.0), (5.0, 1.0, 0.0))
    cfg = EstimatorConfig(prefill_token_budget=2000, max_decode_batch=100)
    est = estimate_splits(profile, _workload(4.0, 1000, 0, 100), 6, [2], reference_prefill=2, config=cfg)
    # k = 2 prompts per batch: 10 + 0.1·2000 = 210 ms → s = 0.105 s per prompt.
    assert est.prefill_capacity_rps[0] == pytest.approx(2 / 0.105)
    # B_max = 100: t_d = 105 ms; 4 nodes × 100 / (100 tokens × 0.105 s).
    assert est.decode_capacity_rps[0] == pytest.approx(400 / 10.5)
    assert est.capacity_rps[0] == pytest.approx(2 / 0.105)
    assert est.tokens_per_s[0] == pytest.approx(100 * 2 / 0.105)
    # Little: B = 1 rps·100·0.005 / (1 − 1·100·0.001) = 0.5/0.9; TPOT = 5 + B ms.
    assert est.decode_batch[0] == pytest.approx(0.5 / 0.9)
    assert est.tpot_s[0] == pytest.approx((5 + 0.5 / 0.9) / 1000)
    # ρ = 4·0.105/2 = 0.21; P95 wait = s·ln(20ρ)/(2(1−ρ)); own batch ρ·k = 0.42 → 1 prompt: 110 ms.
    assert est.ttft_s[0] == pytest.approx(0.105 * math.log(4.2) / (2 * 0.79) + 0.110)
    # Mean response: mean wait ρ·s/(2(1−ρ)) + own batch, then 100 tokens at TPOT.
    assert est.e2e_s[0] == pytest.approx(0.21 * 0.105 / (2 * 0.79) + 0.110 + 100 * (5 + 0.5 / 0.9) / 1000)
    assert bool(est.feasible[0])
    assert est.gain_rps[0] == 0 and est.capacity_sd_rps[0] == 0  # known coefficients, no spread


def test_hand_computed_local_prefill_and_kv_cap() -> None:
    profile = Profile.from_coefficients((10.0, 0.1, 0.01, 0.0), (5.0, 1.0, 0.001))
    cfg = EstimatorConfig(prefill_token_budget=2000, kv_usable_fraction=0.9)  # a scheduler watermark of 10 %
    w = _workload(2.0, 1000, 1000, 200, f=0.5, ul=100, cl=1000)
    est = estimate_splits(profile, w, 4, [1, 2], reference_prefill=1, kv_capacity_tokens=100_000, config=cfg)
    s_req = (10 + 0.1 * 2000 + 0.01 * 2000) / 2 / 1000  # 0.115 s
    s_loc = (10 + 0.1 * 100 + 0.01 * 1000) / 1000  # 0.030 s on the decode node
    ctx = 0.5 * 2000 + 0.5 * 1100 + 100  # 1,650 KV tokens per running request
    b_max = 90_000 / ctx  # 54.5 requests fit in 90 % of the KV
    td_max = (5 + b_max + 0.001 * b_max * ctx) / 1000
    assert est.prefill_capacity_rps[0] == pytest.approx(1 / (0.5 * s_req))
    assert est.decode_capacity_rps[0] == pytest.approx(3 * b_max / (200 * td_max + b_max * 0.5 * s_loc))
    assert est.capacity_rps[0] == pytest.approx(est.decode_capacity_rps[0])
    rho_loc = 2 * 0.5 * s_loc / 3
    batch = (2 / 3) * 200 * 0.005 / ((1 - rho_loc) - (2 / 3) * 200 * (1 + 0.001 * ctx) / 1000)
    assert est.tpot_s[0] == pytest.approx((5 + batch + 0.001 * batch * ctx) / 1000 / (1 - rho_loc))
    rho = 2 * 0.5 * s_req
    assert est.ttft_s[0] == pytest.approx(s_req * math.log(20 * rho) / (2 * (1 - rho)) + 0.120)
    # Moving a decode node to prefill only loses decode capacity here.
    assert est.gain_rps[1] == pytest.approx(est.capacity_rps[1] - est.capacity_rps[0])
    assert est.gain_rps[1] < 0
    cost = switch_cost(est, 1, 2, 4, cfg)
    assert cost.nodes_moved == 1 and cost.node_seconds == pytest.approx(6.2)
    assert cost.lost_requests == pytest.approx(6.2 * est.decode_capacity_rps[0] / 3)


def test_overload_is_infeasible_and_unstable() -> None:
    profile = Profile.from_coefficients((10.0, 0.1, 0.0, 0.0), (5.0, 1.0, 0.0))
    est = estimate_splits(
        profile, _workload(100.0, 1000, 0, 100), 4, [1, 2, 3], reference_prefill=2, slo=SLO(ttft_s=2.0)
    )
    assert not est.feasible.any()
    assert (est.ttft_s >= 1e6).all()  # queues never drain
    preds = to_predictions(est, np.zeros(3), z=1.645)
    assert [p.prefill_nodes for p in preds] == [1, 2, 3]
    assert all(math.isfinite(p.ttft_s) for p in preds)


def test_uncertainty_from_fitted_model() -> None:
    profile = Profile.from_records(synthetic_records(200, seed=3, noise=0.1))
    w = _workload(20.0, 2000, 6000, 300, n=200)
    est = estimate_splits(profile, w, 16, np.arange(1, 16), reference_prefill=5)
    i = est.index(5)
    assert est.gain_rps[i] == 0 and est.gain_sd_rps[i] == 0  # no gain over itself
    assert (est.capacity_sd_rps > 0).all()
    # Errors shared by both splits cancel: the gain is known better than the sum of both spreads.
    j = est.index(7)
    assert est.gain_sd_rps[j] < est.capacity_sd_rps[i] + est.capacity_sd_rps[j]
    preds = to_predictions(est, np.zeros(15), z=1.645)
    assert all(p.throughput_lo_rps <= p.throughput_rps <= p.throughput_hi_rps for p in preds)


def test_batched_prefill_attention_is_per_prompt() -> None:
    # prefill t = 10 + 0.1·u + 0.01·cached + 1·pairs/1e4 ms; 4,000-token batches of k = 4 prompts
    # (u = 1000 over 3000 cached): 10 + 400 + 120 + 4·1000·4000/1e4 = 2,130 ms, s = 0.5325 s per prompt
    # (from the batch's totals, 4000·16000/1e4 = 6,400 ms of attention, it would be 1.7225 s).
    profile = Profile.from_coefficients((10.0, 0.1, 0.01, 1.0), (5.0, 1.0, 0.0))
    cfg = EstimatorConfig(prefill_token_budget=4000)
    est = estimate_splits(profile, _workload(1.0, 1000, 3000, 100), 6, [2], reference_prefill=2, config=cfg)
    assert est.prefill_capacity_rps[0] == pytest.approx(2 / 0.5325)
    # TTFT: ρ = 1·0.5325/2; the own iteration holds ρ·k = 1.065 prompts, each attending to its own
    # context: 10 + 1.065·(100 + 30 + 400) ms (from the totals, the attention would be 1.065² times one prompt's).
    rho = 0.5325 / 2
    own = (10 + 1.065 * (100 + 30 + 400)) / 1000
    assert est.ttft_s[0] == pytest.approx(0.5325 * math.log(20 * rho) / (2 * (1 - rho)) + own)


def test_no_prefill_node_runs_everything_locally_as_the_router_does() -> None:
    # prefill t = 10 + 0.1·u ms; decode t = 5 + 1·B ms. No prefill node: every
    # prompt is computed on a decode node (routing.picker), so P = 0 has capacity.
    profile = Profile.from_coefficients((10.0, 0.1, 0.0, 0.0), (5.0, 1.0, 0.0))
    cfg = EstimatorConfig(prefill_token_budget=2000, max_decode_batch=10)
    w = _workload(2.0, 1000, 0, 100, f=0.5, ul=100, cl=0)
    est = estimate_splits(profile, w, 2, [0, 1], reference_prefill=1, config=cfg)
    # Per request, decode-node prefill work: half local (10 + 10 ms), half long (10 + 100 ms) = 65 ms.
    work = 0.5 * 0.020 + 0.5 * 0.110
    assert est.prefill_capacity_rps[0] == math.inf
    assert est.decode_capacity_rps[0] == pytest.approx(2 * 10 / (100 * 0.015 + 10 * work))
    # 1P1D: local half on the decode node (20 ms each), the long half on the prefill node (k = 2: 105 ms each).
    assert est.decode_capacity_rps[1] == pytest.approx(10 / (100 * 0.015 + 10 * 0.5 * 0.020))
    assert est.prefill_capacity_rps[1] == pytest.approx(1 / (0.5 * 0.105))
    # TTFT at P = 0: an M/G/1 wait for that work (ρ = λ·work/D, cs² = 0), the prompt, one decode step.
    rho = 2.0 * work / 2
    tpot = float(est.tpot_s[0])
    wq = rho * work / (2 * (1 - rho))
    assert est.ttft_s[0] == pytest.approx(wq * math.log(20 * rho) / rho + work + tpot)
    assert est.e2e_s[0] == pytest.approx(wq + work + tpot + 100 * tpot)
    assert bool(est.feasible[0]) and np.isfinite(est.ttft_s).all()


def test_no_prefill_node_doubles_decode_capacity_for_decode_heavy_agents() -> None:
    profile = Profile.from_coefficients((2.0, 0.08, 0.0, 0.0), (1.3, 0.07, 0.0))
    cfg = EstimatorConfig(prefill_token_budget=2048, max_decode_batch=64)
    w = _workload(2.5, 0, 0, 370, f=1.0, ul=150, cl=600)  # short new turns, long answers
    est = estimate_splits(profile, w, 2, [0, 1], reference_prefill=1, config=cfg)
    assert est.capacity_rps[0] == pytest.approx(2 * est.capacity_rps[1])
    assert est.tpot_s[0] < est.tpot_s[1] and est.e2e_s[0] < est.e2e_s[1]


def test_a_fit_with_negative_slopes_never_predicts_steps_cheaper_than_their_fixed_part() -> None:
    # Collinear batch and context can fit b < 0: extrapolated, the step would cost less than nothing.
    profile = Profile.from_coefficients((2.0, 0.08, 0.0, 0.0), (2.5, -0.5, 0.0))
    est = estimate_splits(profile, _workload(5.0, 0, 0, 300, f=1.0, ul=100), 2, [0, 1], reference_prefill=1)
    assert (est.tpot_s >= 0.0025 - 1e-12).all() and (est.e2e_s > 0).all() and np.isfinite(est.capacity_rps).all()
