"""Benchmark entry points return the documented shapes."""

from __future__ import annotations

import pytest

from bench._cpu_share import share_between
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


def test_cpu_share_between_samples() -> None:
    """Cumulative (ran, waited) ns at 0, 1, 2, 3 s: the share over a step is
    taken between the samples around it."""
    t = [0.0, 1.0, 2.0, 3.0]
    ran = [0, 400, 900, 900]
    waited = [0, 600, 600, 600]
    assert share_between(t, ran, waited, 0.2, 0.8) == pytest.approx(0.4)  # 400 / (400 + 600)
    assert share_between(t, ran, waited, 1.0, 2.0) == pytest.approx(1.0)  # ran 500, waited 0
    assert share_between(t, ran, waited, 0.5, 1.5) == pytest.approx(900 / 1500)
    assert share_between(t, ran, waited, 2.1, 2.9) == 1.0  # idle: neither ran nor waited
    assert share_between(t, ran, waited, -0.1, 0.5) is None  # before the first sample
    assert share_between(t, ran, waited, 2.5, 3.5) is None  # after the last
