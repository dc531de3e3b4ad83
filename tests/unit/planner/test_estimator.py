"""Split predictions against hand-computed values, uncertainty, switch cost."""

from __future__ import annotations

import dataclasses
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
    # The 2 prefill nodes are one M/G/2 queue at ρ = 4·0.105/2 = 0.21: P(wait) = ρ^(√6 − 1),
    # a waiting prompt waits θ = s/(2·2·(1 − ρ)) on average, P95 = θ·ln(P(wait)/0.05);
    # own batch ρ·k = 0.42 → 1 prompt: 110 ms.
    p_wait, theta = 0.21 ** (math.sqrt(6) - 1), 0.105 / (4 * 0.79)
    assert est.ttft_s[0] == pytest.approx(theta * math.log(p_wait / 0.05) + 0.110)
    # Mean response: mean wait P(wait)·θ + own batch, then 100 tokens at TPOT (decode slots never wait here).
    assert est.e2e_s[0] == pytest.approx(p_wait * theta + 0.110 + 100 * (5 + 0.5 / 0.9) / 1000)
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

    def local_work(m: float) -> float:  # m local prompts join an iteration: they share its 10 ms intercept
        return 0.5 * (s_loc - 0.010 * (1 - -math.expm1(-m) / m))

    # Saturated, B_max / 200 requests join each iteration, half of them local.
    loc_sat = local_work(0.5 * b_max / 200)
    assert loc_sat < 0.5 * s_loc
    assert est.decode_capacity_rps[0] == pytest.approx(3 * b_max / (200 * td_max + b_max * loc_sat))
    assert est.capacity_rps[0] == pytest.approx(est.decode_capacity_rps[0])
    tpot = td_max  # m = f·λ/D·TPOT and TPOT depends on m: the fixed point
    for _ in range(20):
        rho_loc = (2 / 3) * local_work(0.5 * (2 / 3) * tpot)
        batch = (2 / 3) * 200 * 0.005 / ((1 - rho_loc) - (2 / 3) * 200 * (1 + 0.001 * ctx) / 1000)
        tpot = (5 + batch + 0.001 * batch * ctx) / 1000 / (1 - rho_loc)
    assert est.tpot_s[0] == pytest.approx(tpot, rel=1e-6)
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
    # prefill t = 10 + 0.1·u + 0.01·cached + 1·pairs/1e4 ms; 4,000-token iterations filled with
    # u = 1000 over 3000 cached. Per prompt: a quarter of the intercept, 100 + 30 ms, and its own
    # attention, chunked at a uniform offset in the budget: u·c + u² − u³/(6B) = 3,958,333 pairs
    # (from a batch's totals, 4000·16000/1e4 = 6,400 ms per 4 prompts, it would be 1.6 s each).
    profile = Profile.from_coefficients((10.0, 0.1, 0.01, 1.0), (5.0, 1.0, 0.0))
    cfg = EstimatorConfig(prefill_token_budget=4000)
    est = estimate_splits(profile, _workload(1.0, 1000, 3000, 100), 6, [2], reference_prefill=2, config=cfg)
    s = (2.5 + 130 + (3e6 + 1e6 - 1e9 / 24_000) / 1e4) / 1000
    assert est.prefill_capacity_rps[0] == pytest.approx(2 / s)
    # TTFT: M/G/2 at ρ = s/2; the own iteration (alone: u·(u + c) = 4e6 pairs) holds ρ·k = 4ρ prompts:
    # 10 + 530 ms, plus (ρ·4 − 1) batch-mates of the mean prompt's 130 + 395.8 ms.
    rho = s / 2
    p_wait, theta = rho ** (math.sqrt(6) - 1), s / (4 * (1 - rho))
    own = (10 + 530 + (4 * rho - 1) * (s * 1000 - 2.5)) / 1000
    assert est.ttft_s[0] == pytest.approx(theta * math.log(p_wait / 0.05) + own)


def test_long_prompts_cost_their_chunks_and_the_mix_its_mean_attention() -> None:
    # GB300 profile terms at long contexts, B = 8,192: one 30,000-token prompt over 2,000 cached
    # costs 15·30000/8192 intercept-ms, 0.008·30000, 1e-5·2000 and 0.0113·pairs/1e4 with
    # pairs = 30000·2000 + (30000² + 30000·8192 − 8192²/3)/2 (chunked at a uniform offset).
    profile = Profile.from_coefficients((15.0, 0.008, 1e-5, 0.0113), (12.0, 0.06, 8.4e-6))
    pairs = 30_000 * 2_000 + (30_000**2 + 30_000 * 8_192 - 8_192**2 / 3) / 2
    s = (15 * 30_000 / 8_192 + 240 + 0.02 + 0.0113 * pairs / 1e4) / 1000
    w = _workload(1.0, 30_000, 2_000, 300)
    assert estimate_splits(profile, w, 9, [3], reference_prefill=3).prefill_capacity_rps[0] == pytest.approx(3 / s)
    # A window whose E[pairs] is known (one prompt in ten of 30k, the rest 1k) prices that, not the mean's.
    mixed = dataclasses.replace(_workload(1.0, 3_900, 0, 300), remote_pairs_mean=0.9 * 1.0e6 + 0.1 * 9.0e8)
    s_mix = (15 * 3_900 / 8_192 + 0.008 * 3_900 + 0.0113 * (0.9e6 + 0.9e8) / 1e4) / 1000
    assert estimate_splits(profile, mixed, 9, [3], reference_prefill=3).prefill_capacity_rps[0] == pytest.approx(
        3 / s_mix
    )


def test_decode_batch_is_length_biased_at_long_contexts() -> None:
    # Requests hold their KV for o iterations: half of them 30,000-token prompts with 1,900-token
    # outputs, half 1,000 with 100: E[o] = 1,000, E[o·prompt] = 0.5·(1900·30000 + 100·1000) = 28.55e6,
    # E[o²] = 0.5·(1900² + 100²) = 1.81e6. KV per running request, output reserved (the simulator's
    # admission): (28.55e6 + 1.81e6)/1000 = 30,360 tokens, not the mean prompt + output (16,500).
    profile = Profile.from_coefficients((15.0, 0.008, 1e-5, 0.0113), (12.0, 0.06, 8.4e-6))
    w = dataclasses.replace(_workload(0.1, 15_500, 0, 1_000), prompt_output_mean=28.55e6, output_sq_mean=1.81e6)
    reserved = EstimatorConfig(kv_output_reserved=1.0)
    est = estimate_splits(profile, w, 9, [3], reference_prefill=3, kv_capacity_tokens=3.5e6, config=reserved)
    b_max = 3.5e6 / 30_360
    ctx = (28.55e6 + 1.81e6 / 2) / 1000  # the batch's mean context: 29,455 tokens
    td = (12 + 0.06 * b_max + 8.4e-6 * b_max * ctx) / 1000
    assert est.decode_capacity_rps[0] == pytest.approx(6 * b_max / (1_000 * td))
    grows = estimate_splits(profile, w, 9, [3], reference_prefill=3, kv_capacity_tokens=3.5e6)
    assert grows.decode_capacity_rps[0] > est.decode_capacity_rps[0]  # KV that grows with the output fits more


def test_no_prefill_node_runs_everything_locally_as_the_router_does() -> None:
    # prefill t = 10 + 0.1·u ms; decode t = 5 + 1·B ms. No prefill node: every
    # prompt is computed on a decode node (routing.picker), so P = 0 has capacity.
    profile = Profile.from_coefficients((10.0, 0.1, 0.0, 0.0), (5.0, 1.0, 0.0))
    cfg = EstimatorConfig(prefill_token_budget=2000, max_decode_batch=10)
    w = _workload(2.0, 1000, 0, 100, f=0.5, ul=100, cl=0)
    est = estimate_splits(profile, w, 2, [0, 1], reference_prefill=1, config=cfg)

    # Per request, decode-node prefill work: half local (10 + 10 ms), half long (10 + 100 ms) = 65 ms,
    # of which the 10 ms intercept is shared by the m prompts that join one iteration.
    def shared(m: float) -> float:
        return -math.expm1(-m) / m

    work = 0.5 * 0.020 + 0.5 * 0.110
    assert est.prefill_capacity_rps[0] == math.inf
    # Saturated: B_max / o = 0.1 prompts join each iteration.
    work_sat = work - 0.010 * (1 - shared(0.1))
    assert est.decode_capacity_rps[0] == pytest.approx(2 * 10 / (100 * 0.015 + 10 * work_sat))
    # 1P1D: local half on the decode node (20 ms each), the long half on the prefill node (k = 2: 105 ms each).
    loc_sat = 0.5 * 0.020 - 0.5 * 0.010 * (1 - shared(0.05))
    assert est.decode_capacity_rps[1] == pytest.approx(10 / (100 * 0.015 + 10 * loc_sat))
    assert est.prefill_capacity_rps[1] == pytest.approx(1 / (0.5 * 0.105))
    # TTFT at P = 0: an M/G/1 wait for that work (ρ = λ·work/D, cs² = 0), the prompt, one decode step,
    # and the wait for one of the D·B_max = 20 decode slots (each held 100 steps of 15 ms; M/M/20).
    tpot = float(est.tpot_s[0])
    work = work - 0.010 * (1 - shared(1.0 * tpot))  # 1 prompt a second per node, one iteration each TPOT
    rho = 2.0 * work / 2
    wq = rho * work / (2 * (1 - rho))
    rho_d = 2.0 / float(est.decode_capacity_rps[0])
    slot = rho_d ** (math.sqrt(42) - 1) * 100 * 0.015 * 2 / (2 * 20 * (1 - rho_d))
    assert est.ttft_s[0] == pytest.approx(wq * math.log(20 * rho) / rho + work + tpot + slot, rel=1e-5)
    assert est.e2e_s[0] == pytest.approx(wq + work + tpot + slot + 100 * tpot, rel=1e-5)
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
