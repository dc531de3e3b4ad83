"""The planner's split model against the simulator's ground truth at 2k-50k tokens of context.

A saturated simulated node (GB300 profile) is timed on a queue of prompts or
decodes; the estimator, given the same requests as a workload estimate, must
predict that node's throughput. Long prompts are where a mean prompt and a
per-request intercept went wrong (issue 19: 32.8 req/s predicted, 15.5 seen).
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.estimator import estimate_splits
from planner.estimator_config import EstimatorConfig
from planner.profile import Profile
from planner.types import RequestSample
from planner.workload import WorkloadConfig, WorkloadEstimator, attention_pairs
from sim.decode import DecodeEngine
from sim.events import EventLoop
from sim.node import PrefillEngine
from sim.profiles import GpuProfile
from sim.state import SimRequest
from sim.workloads import Request

GPU = GpuProfile.from_json()
PROFILE = Profile.from_coefficients(GPU.model.prefill, GPU.model.decode)
SIM_KV = EstimatorConfig(kv_output_reserved=1.0)  # the simulated decode engine reserves the output


def _estimate(prompts: list[tuple[int, int, int]], nodes: int, prefill: int, **kw):
    """prompts: (uncached, cached, output) per request, offered far beyond capacity."""
    w = WorkloadEstimator(WorkloadConfig(window_s=100.0, local_prefill_max_tokens=0))
    w.observe([RequestSample(float(i % 100), u, c, o) for i, (u, c, o) in enumerate(prompts)])
    est = w.estimate(now=100.0)
    return estimate_splits(PROFILE, est, nodes, [prefill], reference_prefill=prefill, config=SIM_KV, **kw)


def _prefill_node_rps(prompts: list[tuple[int, int, int]]) -> float:
    loop, done = EventLoop(), []
    eng = PrefillEngine("p", loop, GPU.model, GPU.node, lambda sr, t: done.append(t), [])
    for i, (u, c, o) in enumerate(prompts):
        sr = SimRequest(Request(i, "s", f"b{i}", 0.0, u + c, o), 0.0)
        sr.cached = c
        eng.submit(sr)
    loop.run(1e9)
    return _steady_rate(done)


def _steady_rate(done: list[float]) -> float:
    """Completions per second between the 20th and the 70th percentile of
    completion times: a full queue, not the start or the draining tail."""
    t = np.sort(done)
    a, b = int(0.2 * len(t)), int(0.7 * len(t))
    return (b - a) / (t[b] - t[a])


@pytest.mark.parametrize("tokens", [2_000, 10_000, 30_000, 50_000])
def test_prefill_capacity_of_one_node_matches_the_simulator(tokens: int) -> None:
    prompts = [(tokens, 1_000, 200)] * (60 + 2_000_000 // tokens)
    predicted = float(_estimate(prompts, 2, 1).prefill_capacity_rps[0])
    assert predicted == pytest.approx(_prefill_node_rps(prompts), rel=0.03)


def test_a_mix_of_short_and_long_prompts_costs_its_mean_attention_not_the_mean_prompts() -> None:
    rng = np.random.default_rng(0)
    prompts = [(30_000 if rng.random() < 0.1 else 1_000, 0, 100) for _ in range(400)]
    seen = _prefill_node_rps(prompts)
    predicted = float(_estimate(prompts, 2, 1).prefill_capacity_rps[0])
    assert predicted == pytest.approx(seen, rel=0.03)
    # The mean prompt (~3.9k tokens) alone: u·(u + min(u, B)) / 2 of the mean is ~3x too little attention.
    u = np.array([p[0] for p in prompts], dtype=float)
    assert attention_pairs(u, np.zeros_like(u), 8192).mean() > 3 * attention_pairs(u.mean(), 0.0, 8192)


def _decode_node_rps(prompt: int, outputs: list[int]) -> float:
    loop, done = EventLoop(), []
    eng = DecodeEngine("d", loop, GPU.model, GPU.node, lambda sr, t: None, lambda sr, t: done.append(t), [])
    for i, o in enumerate(outputs):
        sr = SimRequest(Request(i, "s", f"b{i}", 0.0, prompt, o), 0.0)
        sr.generated = 1
        eng.submit(sr)
    loop.run(1e9)
    return _steady_rate(done)


@pytest.mark.parametrize("context", [2_000, 10_000, 30_000, 50_000])
def test_decode_capacity_of_one_node_at_long_contexts_matches_the_simulator(context: int) -> None:
    rng = np.random.default_rng(1)
    outputs = [int(x) for x in rng.integers(50, 1_500, 1_500)]  # varied: the batch is length-biased
    est = _estimate([(context, 0, o) for o in outputs], 2, 1, kv_capacity_tokens=GPU.node.kv_capacity_tokens)
    assert float(est.decode_capacity_rps[0]) == pytest.approx(_decode_node_rps(context, outputs), rel=0.06)
