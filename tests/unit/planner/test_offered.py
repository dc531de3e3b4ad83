"""Offered mix of a closed loop: weights, turn gaps, weighted estimates, and the decision they change."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core import Phase
from planner.evolving import EvolvingConfig, EvolvingPlanner
from planner.offered import TurnGaps, offered_weights, unloaded_response_s
from planner.profile import Profile
from planner.types import SLO, ClusterView, NodeState, RequestSample
from planner.workload import WorkloadConfig, WorkloadEstimator

# Prefill 10 ms + 0.1 ms per uncached token; decode 10 ms per step, flat.
PROFILE = Profile.from_coefficients((10.0, 0.1, 0.0, 0.0), (10.0, 0.0, 0.0))


def test_unloaded_response_is_one_prefill_then_the_decode_steps() -> None:
    r0 = unloaded_response_s(PROFILE, np.array([1000.0]), np.array([0.0]), np.array([101.0]))
    assert r0[0] == pytest.approx(0.110 + 100 * 0.010)  # 110 ms prefill, 100 further tokens at 10 ms


def test_weights_undo_the_wait_and_leave_unknown_gaps_alone() -> None:
    samples = [
        RequestSample(0.0, 1000, 0, 101, e2e_s=11.11, gap_s=2.0),  # waited 10 s more than unloaded
        RequestSample(0.0, 1000, 0, 101),  # open loop / first turn: no gap known
        RequestSample(0.0, 1000, 0, 101, e2e_s=0.5, gap_s=2.0),  # faster than the model: not below 1
        RequestSample(0.0, 1000, 0, 101, e2e_s=500.0, gap_s=0.0),  # capped
    ]
    w = offered_weights(PROFILE, samples, max_weight=10.0)
    assert w[0] == pytest.approx((2.0 + 11.11) / (2.0 + 1.11))
    assert w.tolist()[1:] == [1.0, 1.0, 10.0]
    untrained = Profile()
    assert offered_weights(untrained, samples, 10.0).tolist() == [1.0] * 4


def test_turn_gaps_per_branch() -> None:
    gaps = TurnGaps(capacity=2)
    assert gaps.finished("a", arrival=0.0, finish=5.0, last_in_branch=False) is None
    assert gaps.finished("a", arrival=7.5, finish=9.0, last_in_branch=False) == 2.5
    assert gaps.finished("a", arrival=10.0, finish=12.0, last_in_branch=True) == 1.0
    assert len(gaps) == 0  # an ended branch is dropped
    for b in "xyz":
        gaps.finished(b, 0.0, 1.0, False)
    assert len(gaps) == 2 and gaps.finished("x", 2.0, 3.0, False) is None  # least recent forgotten
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        TurnGaps(capacity=0)


def test_weighted_means_unweighted_rate() -> None:
    est = WorkloadEstimator(WorkloadConfig(window_s=10.0))
    est.observe([RequestSample(1.0, 1000, 0, 10), RequestSample(2.0, 2000, 0, 10)], weights=[1.0, 3.0])
    e = est.estimate(now=10.0)
    assert e.n == 2 and e.rate_rps == pytest.approx(0.2)
    assert e.uncached_mean == pytest.approx(1750.0)
    with pytest.raises(ValueError, match="one weight > 0 per sample"):
        est.observe([RequestSample(1.0, 1000, 0, 10)], weights=[0.0])


def _view(prefill: int, n: int, now: float) -> ClusterView:
    nodes = tuple(NodeState(f"n{i}", Phase.PREFILL if i < prefill else Phase.DECODE) for i in range(n))
    return ClusterView(now=now, nodes=nodes, slo=SLO(ttft_s=1e3, tpot_s=10.0))


def test_starved_prompt_heavy_agents_pull_the_split_toward_prefill() -> None:
    """At 1 prefill node of 8, prompt-heavy agents queue for prefill and send
    few requests; the served mix looks decode-heavy. Weighted by their wait,
    the planner sees the mix they offer and predicts more prefill nodes."""
    profile = Profile.from_coefficients((10.0, 0.05, 0.002, 0.01), (10.0, 0.5, 0.0002))
    rng = np.random.default_rng(0)
    samples = []
    for t in np.arange(0.0, 300.0, 0.5):
        if rng.random() < 0.25:  # prompt-heavy agent turn, 40 s in the prefill queue
            samples.append(RequestSample(float(t), 6000, 20_000, 50, e2e_s=40.0, gap_s=2.0))
        else:  # reasoning turn, served about as fast as unloaded
            samples.append(RequestSample(float(t), 1000, 2000, 800, e2e_s=12.0, gap_s=2.0))

    def best(offered: bool) -> int:
        planner = EvolvingPlanner(EvolvingConfig(offered_mix=offered), profile)
        planner.observe_requests(samples)
        d = planner.decide(dataclasses.replace(_view(1, 8, 300.0)))
        return max(d.predictions, key=lambda p: p.throughput_rps).prefill_nodes

    assert best(offered=True) > best(offered=False)
