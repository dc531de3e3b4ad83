"""GpuProfile.from_planner_profile and the pure parts of bench.fidelity (no cluster)."""

from __future__ import annotations

import pytest

from bench.fidelity import SliceConfig, build_slice, rel_err, summarize
from bench.fidelity_latency import step_overhead_ms
from core import Phase
from planner.profile import Profile
from planner.types import IterationRecord
from sim.profiles import GpuProfile
from sim.state import NodeConfig

PREFILL = (20.0, 0.01, 0.001, 0.5)  # ms, per uncached, per cached, per pair/1e4
DECODE = (3.0, 0.05, 0.0002)  # ms, per sequence, per context token
NODE = NodeConfig(chunk_tokens=2048, max_batch=64, kv_capacity_tokens=100_000, kv_bytes_per_token=512)


def _records() -> list[IterationRecord]:
    out, t = [], 0.0
    for i in range(200):
        u, c = 64 + 37 * (i % 40), 32 * (i % 23)
        ms = PREFILL[0] + PREFILL[1] * u + PREFILL[2] * c + PREFILL[3] * u * (u + c) / 1e4
        t += 1.0
        out.append(IterationRecord("p", Phase.PREFILL, t, 1, u, c, 1, 0, ms))
        b, ctx = 1 + i % 17, 500 + 211 * (i % 31)
        out.append(
            IterationRecord("d", Phase.DECODE, t + 0.5, b, 0, 0, b, ctx, DECODE[0] + DECODE[1] * b + DECODE[2] * ctx)
        )
    return out


def test_fitted_profile_becomes_the_same_iteration_model() -> None:
    gpu = GpuProfile.from_planner_profile(Profile.from_records(_records()), name="fit", node=NODE)
    assert gpu.model.prefill == pytest.approx(PREFILL, rel=1e-3, abs=1e-6)
    assert gpu.model.decode == pytest.approx(DECODE, rel=1e-3, abs=1e-7)
    assert gpu.model.predict_prefill_ms(1000, 500) == pytest.approx(20 + 10 + 0.5 + 0.5 * 1000 * 1500 / 1e4, rel=1e-3)
    assert gpu.node is NODE and gpu.gpus_per_node == 1


def test_step_overhead_goes_into_both_intercepts_and_negative_slopes_clamp() -> None:
    profile = Profile.from_coefficients((5.0, -0.001, 0.0, 0.2), (1.0, 0.1, -1e-6))
    gpu = GpuProfile.from_planner_profile(profile, name="x", node=NODE, step_overhead_ms=2.5)
    assert gpu.model.prefill == pytest.approx((7.5, 0.0, 0.0, 0.2))
    assert gpu.model.decode == pytest.approx((3.5, 0.1, 0.0))
    with pytest.raises(ValueError, match="step_overhead_ms must be >= 0"):
        GpuProfile.from_planner_profile(profile, name="x", node=NODE, step_overhead_ms=-1.0)


def test_step_overhead_counts_only_unchanged_busy_decode_batches() -> None:
    recs = [IterationRecord("d", Phase.DECODE, t, 4, 0, 0, 4, 100, 10.0) for t in (1.000, 1.012, 1.024)]
    recs.append(IterationRecord("d", Phase.DECODE, 1.5, 5, 0, 0, 5, 100, 10.0))  # batch changed: skipped
    assert step_overhead_ms(recs) == pytest.approx(2.0)
    assert step_overhead_ms([]) == 0.0


def test_summary_window_and_errors() -> None:
    s = summarize([(0.0, 0.5, 1.0), (1.0, 1.25, 4.0)])
    assert s == {"completed": 2, "window_s": 4.0, "throughput_rps": 0.5, "mean_e2e_s": 2.0, "mean_ttft_s": 0.375}
    assert rel_err(1.1, 1.0) == pytest.approx(0.1)


def test_slice_is_deterministic_and_bounded() -> None:
    a, pa = build_slice(SliceConfig(seed=3))
    b, pb = build_slice(SliceConfig(seed=3))
    assert a == b and pa == pb
    assert all(r.prompt_tokens == len(pa[r.req_id]) <= 3000 and 16 <= r.output_tokens <= 128 for r in a)
    assert all(len(r.block_hashes) == r.prompt_tokens // 32 for r in a)
    # turns of a session share their prefix blocks
    s0 = [r for r in a if r.session_id == "s0"]
    assert s0[1].block_hashes[: len(s0[0].block_hashes)] == s0[0].block_hashes


def _rec(node: str, end: float, elapsed_ms: float) -> IterationRecord:
    return IterationRecord(node, Phase.DECODE, end, 1, 0, 0, 1, 100, elapsed_ms)


def _timing(role: str, arrived: float, got: float, peers: int = 0, e2e: float | None = None) -> dict:
    node = "p" if role == "prefill" else "d"
    return {
        "role": role,
        "node_id": node,
        "t": got,
        "engine_ttft_s": got - arrived,
        "peer_blocks": peers,
        "engine_e2e_s": e2e,
    }


def test_engine_latencies_split_input_pull_and_output_time_of_requests_alone_in_the_engine() -> None:
    from bench.fidelity_latency import engine_latencies

    records = [
        _rec("p", 10.020, 10.0),  # starts 10.010
        _rec("d", 20.010, 8.0),  # starts 20.002
        _rec("d", 30.020, 5.0),  # starts 30.015
        _rec("d", 40.010, 5.0),
        _rec("d", 40.020, 5.0),
    ]  # two iterations: a queued request
    timings = {
        "a.1": _timing("prefill", 10.005, 10.025, peers=3),  # in 5 ms (pulled), out 5 ms
        "b.1": _timing("decode", 20.000, 20.012),  # in 2 ms, out 2 ms
        "a.2": _timing("decode", 30.000, 30.023, peers=3),  # in 15 ms (pulled), out 3 ms
        "c.1": _timing("decode", 40.001, 40.024),
    }  # queued: counts for out (4 ms) only
    e = engine_latencies(records, timings)
    assert e.engine_in_s == pytest.approx(0.002)
    assert e.pull_latency_s == pytest.approx(0.013) and e.prefill_pull_latency_s == pytest.approx(0.003)
    assert e.engine_out_s == pytest.approx(0.003) and e.prefill_out_s == pytest.approx(0.005)
    assert e.samples == {"out": 3, "prefill_out": 1, "local_in": 1, "pulled_in": 1, "prefill_pulled_in": 1}


def test_stream_lag_is_the_last_tokens_path_beyond_the_first_tokens() -> None:
    from bench.fidelity_latency import stream_lag_s

    results = [{"id": "x", "t0": 0.0, "ttft": 0.050, "t1": 0.400}, {"id": "y", "t0": 1.0, "ttft": 1.050, "t1": 1.300}]
    timings = {
        "x.1": _timing("decode", 5.0, 5.030, e2e=0.350),  # first 20 ms outside the engine, last 50 ms
        "y.1": _timing("prefill", 6.0, 6.030, e2e=0.030),
        "y.2": _timing("decode", 6.1, 6.2, e2e=0.2),
    }
    assert stream_lag_s(results, timings) == pytest.approx(0.030)  # y has two segments: not counted
    assert stream_lag_s(results[1:], timings) is None
