"""Offered load counted at arrival (planner.arrivals)."""

from __future__ import annotations

import pytest

from planner.arrivals import ArrivalHistory


def test_rate_over_a_window_interpolates_between_ticks() -> None:
    h = ArrivalHistory()
    for t, n in [(10.0, 100), (20.0, 400), (30.0, 700), (40.0, 1000)]:
        h.add(t, n)
    assert h.rate(20.0, 40.0) == pytest.approx(30.0)
    assert h.rate(15.0, 35.0) == pytest.approx((850 - 250) / 20)
    assert h.rate(0.0, 40.0) == pytest.approx(900 / 30)  # only the covered 30 s count
    assert h.rate(35.0, 40.0) is None  # shorter than 10 s of history: no estimate
    assert ArrivalHistory().rate(0.0, 10.0) is None


def test_a_counter_that_goes_down_starts_over_and_old_ticks_are_forgotten() -> None:
    h = ArrivalHistory(retention_s=100.0)
    h.add(0.0, 50)
    h.add(10.0, 60)
    h.add(20.0, 5)  # a restarted gateway
    h.add(40.0, 25)
    assert h.rate(0.0, 40.0) == pytest.approx(1.0)
    for t in range(50, 400, 10):
        h.add(float(t), t)
    assert h.rate(0.0, 390.0) == pytest.approx((390 - 280) / 110)  # history back to t=280 (+ one before)
    with pytest.raises(ValueError, match="retention_s must be > 0"):
        ArrivalHistory(retention_s=0.0)
