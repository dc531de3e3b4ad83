"""SlidingWindowLog: at most N in any window, literal times."""

from __future__ import annotations

import math

import pytest

from gateway.serving.policy.windows import SlidingWindowLog


def test_at_most_the_limit_in_any_window_and_the_wait_until_the_oldest_leaves() -> None:
    w = SlidingWindowLog(3, window_s=60.0)
    for i, t in enumerate((0.0, 10.0, 20.0)):
        assert w.wait_s(1, t) == 0.0
        w.add(1, t, i)
    assert w.used(30.0) == 3
    assert w.wait_s(1, 30.0) == 30.0  # the entry at t=0 leaves at t=60
    assert w.wait_s(2, 30.0) == 40.0  # two must leave: the one at t=10 too
    assert w.wait_s(4, 30.0) == math.inf  # more than the whole limit, ever
    assert w.used(60.0) == 2 and w.wait_s(1, 60.0) == 0.0


def test_amounts_and_removal() -> None:
    w = SlidingWindowLog(100)
    w.add(70, 0.0, 1)
    w.add(20, 5.0, 2)
    assert w.wait_s(20, 6.0) == 54.0
    assert w.remove(1) and not w.remove(1)
    assert w.used(6.0) == 20 and w.wait_s(80, 6.0) == 0.0


def test_a_lower_limit_keeps_what_the_window_holds() -> None:
    w = SlidingWindowLog(5)
    for i in range(4):
        w.add(1, float(i), i)
    w.resize(2)
    assert w.used(4.0) == 4 and w.wait_s(1, 4.0) == 58.0  # three must leave: the one at t=2, at t=62
    with pytest.raises(ValueError, match="limit must be >= 1"):
        w.resize(0)
    with pytest.raises(ValueError, match="limit must be >= 1 and window_s > 0"):
        SlidingWindowLog(0)
