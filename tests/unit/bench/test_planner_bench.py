"""Benchmark entry points return the documented shapes."""

from __future__ import annotations

from bench.planner_bench import decide_bench, fit_mape_from_records
from testing.planner_records import closed_loop, synthetic_records, synthetic_samples


def test_decide_bench_shape() -> None:
    result = decide_bench(node_counts=(16,), repeats=2)
    assert set(result) == {"decide_ms", "decide_cpu_ms", "decide_ms_closed_loop", "decide_cpu_ms_closed_loop"}
    assert all(set(v) == {"16"} and v["16"] > 0 for k, v in result.items() if k.startswith("decide_ms"))


def test_fit_mape_from_records_meets_target_on_synthetic_data() -> None:
    report = fit_mape_from_records(synthetic_records(1000, seed=11, noise=0.05))
    assert set(report) == {"fit_mape_prefill", "fit_mape_decode", "fit_mape_floor", "fit_band_coverage"}
    assert report["fit_mape_prefill"] is not None and report["fit_mape_prefill"] <= 0.15
    assert report["fit_mape_decode"] is not None and report["fit_mape_decode"] <= 0.15


def test_closed_loop_turns_the_given_share_into_agent_turns() -> None:
    samples = synthetic_samples(0.0, 100.0, 20.0, uncached=500, cached=0, output=50, seed=4)
    turned = closed_loop(samples, 0.75, think_s=5.0, e2e_s=8.0, seed=5)
    gaps = [s.gap_s for s in turned if s.gap_s is not None]
    assert abs(len(gaps) / len(samples) - 0.75) < 0.03
    assert min(gaps) >= 0 and all(s.e2e_s == 8.0 for s in turned if s.gap_s is not None)
    assert [s.t for s in turned] == [s.t for s in samples]
    assert closed_loop(samples, 0.0, think_s=5.0, e2e_s=8.0) == samples
