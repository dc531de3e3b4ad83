"""Measured TTFT: the P95 over a span, and the SLO repair it holds back."""

from __future__ import annotations

import dataclasses

import pytest

from planner.ttft import TtftHistory
from testing.planner_records import synthetic_samples
from tests.unit.planner.test_evolving import LAX, PREFILL_HEAVY, _planner, _run_live, _view


def test_p95_over_the_span_after_the_last_switch() -> None:
    h = TtftHistory(retention_s=300.0)
    for t in range(10, 130, 10):
        h.add(float(t), [0.1 * k for k in range(1, 21)])  # 0.1 .. 2.0 s every tick
    assert h.p95(120.0, 60.0, since=None, min_requests=20) == pytest.approx(1.905)
    assert h.p95(120.0, 60.0, since=100.0, min_requests=20) is None  # a switch inside the span
    assert h.p95(120.0, 60.0, since=50.0, min_requests=20) is not None
    assert h.p95(120.0, 60.0, since=None, min_requests=1000) is None  # too few
    h.add(500.0, [9.0])
    assert h.p95(500.0, 60.0, since=None, min_requests=1) == 9.0  # older rows left retention


def test_no_ttft_repair_while_the_measured_ttft_meets_the_bound() -> None:
    # The fake cluster of the repair test in test_verification: 1P breaks the model's TTFT bound.
    done = synthetic_samples(0, 900, 1.8, seed=3, **PREFILL_HEAVY)
    repaired = _run_live(_planner(), done, _view(1, 8, slo=LAX), 5, 900, arrival_rps=4.0)
    assert any(d.acted and d.reason.startswith("SLO repair") for d in repaired)
    # The same requests measured well inside the bound: the split meets it, nothing to repair.
    fast = [dataclasses.replace(s, ttft_s=0.1 * LAX.ttft_s) for s in done]
    held = _run_live(_planner(), fast, _view(1, 8, slo=LAX), 5, 900, arrival_rps=4.0)
    assert not any(d.reason.startswith("SLO repair") for d in held)
    assert any(d.inputs.get("measured_p95_ttft_s", 0.0) == pytest.approx(0.1 * LAX.ttft_s) for d in held)
    # Measured past the bound: repaired as before.
    slow = [dataclasses.replace(s, ttft_s=2.0 * LAX.ttft_s) for s in done]
    again = _run_live(_planner(), slow, _view(1, 8, slo=LAX), 5, 900, arrival_rps=4.0)
    assert any(d.acted and d.reason.startswith("SLO repair") for d in again)
