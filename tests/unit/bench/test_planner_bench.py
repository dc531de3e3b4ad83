"""Benchmark entry points return the documented shapes."""

from __future__ import annotations

from bench.planner_bench import decide_bench, fit_mape_from_records
from testing.planner_records import synthetic_records


def test_decide_bench_shape() -> None:
    result = decide_bench(node_counts=(16,), repeats=2)
    assert set(result) == {"decide_ms", "decide_cpu_ms"}
    assert set(result["decide_ms"]) == {"16"} and result["decide_ms"]["16"] > 0


def test_fit_mape_from_records_meets_target_on_synthetic_data() -> None:
    report = fit_mape_from_records(synthetic_records(1000, seed=11, noise=0.05))
    assert set(report) == {"fit_mape_prefill", "fit_mape_decode", "fit_mape_floor", "fit_band_coverage"}
    assert report["fit_mape_prefill"] is not None and report["fit_mape_prefill"] <= 0.15
    assert report["fit_mape_decode"] is not None and report["fit_mape_decode"] <= 0.15
