"""Sliding-window workload estimate and persistence of a change."""

from __future__ import annotations

import pytest

from planner.types import RequestSample
from planner.workload import WorkloadConfig, WorkloadEstimator


def _samples(start: float, end: float, every: float, u: int, c: int, o: int) -> list[RequestSample]:
    n = int(round((end - start) / every))
    return [RequestSample(start + i * every, u, c, o) for i in range(n)]


def test_window_statistics() -> None:
    est = WorkloadEstimator(WorkloadConfig(window_s=10.0, local_prefill_max_tokens=256))
    est.observe(_samples(0.0, 10.0, 0.5, 1000, 3000, 100))  # 20 remote
    est.observe(_samples(0.25, 10.0, 1.0, 100, 5000, 300))  # 10 local
    w = est.estimate(now=10.0)
    assert w.n == 30 and w.rate_rps == pytest.approx(3.0)
    assert w.local_fraction == pytest.approx(1 / 3)
    assert w.uncached_mean == pytest.approx((20 * 1000 + 10 * 100) / 30)
    assert w.remote_uncached_mean == 1000 and w.remote_uncached_std == 0
    assert w.local_cached_mean == 5000
    assert w.output_mean == pytest.approx((20 * 100 + 10 * 300) / 30)
    assert est.estimate(now=30.0).n == 0  # everything slid out


def test_offered_rate_counts_the_weights_the_served_rate_does_not() -> None:
    est = WorkloadEstimator(WorkloadConfig(window_s=10.0))
    est.observe(_samples(0.0, 10.0, 1.0, 100, 0, 10), weights=[1.0] * 5 + [3.0] * 5)
    w = est.estimate(now=10.0)
    assert w.rate_rps == pytest.approx(1.0) and w.offered_rate_rps == pytest.approx(2.0)
    assert w.summary()["offered_rate_rps"] == pytest.approx(2.0)


def test_old_samples_dropped_and_lag() -> None:
    est = WorkloadEstimator(WorkloadConfig(window_s=10.0, retention_s=20.0, lag_s=5.0))
    est.observe(_samples(100.0, 110.0, 1.0, 1000, 0, 10))
    est.observe([RequestSample(10.0, 1000, 0, 10)])  # far older than retention
    assert est.estimate(now=110.0).n == 5  # window [95, 105)
    assert est.estimate(now=115.0).n == 10


def test_samples_reported_late_are_binned_at_not_before() -> None:
    est = WorkloadEstimator(WorkloadConfig(window_s=10.0))
    est.observe([RequestSample(3.0, 1000, 0, 10), RequestSample(25.0, 1000, 0, 10)], not_before=20.0)
    assert est.estimate(now=10.0).n == 0  # the one that arrived at 3 s counts from 20 s
    assert est.estimate(now=30.0).n == 2 and est.first_t == 20.0


def test_persisted_change_vs_burst() -> None:
    cfg = WorkloadConfig(window_s=60.0)
    steady = WorkloadEstimator(cfg)
    steady.observe(_samples(0.0, 200.0, 0.5, 1000, 0, 500))
    reference = steady.estimate(now=100.0)

    shifted = WorkloadEstimator(cfg)
    shifted.observe(_samples(0.0, 100.0, 0.5, 1000, 0, 500))
    shifted.observe(_samples(100.0, 200.0, 0.5, 6000, 0, 50))
    assert shifted.persisted_change(200.0, reference, span_s=60.0)
    assert not shifted.persisted_change(130.0, reference, span_s=60.0)  # only 30 s of it so far

    burst = WorkloadEstimator(cfg)
    burst.observe(_samples(0.0, 200.0, 0.5, 1000, 0, 500))
    burst.observe(_samples(180.0, 190.0, 0.05, 6000, 0, 50))  # 200 sub-agents in 10 s
    assert burst.estimate(now=200.0).uncached_mean > 3000  # the window average is dominated...
    assert not burst.persisted_change(200.0, reference, span_s=60.0)  # ...but it did not persist
    assert not steady.persisted_change(200.0, reference, span_s=60.0)
