"""Token buckets over literal times."""

from __future__ import annotations

import math

import pytest

from gateway.serving.policy.buckets import TokenBucket


def test_starts_full_and_refills_continuously() -> None:
    b = TokenBucket.per_minute(60, now=0.0)  # 1 token/s, burst 60
    assert b.wait_s(60, 0.0) == 0.0
    b.take(60, 0.0)
    assert b.available(0.0) == 0.0
    assert b.wait_s(1, 0.0) == pytest.approx(1.0)
    assert b.wait_s(1, 0.5) == pytest.approx(0.5)
    assert b.available(10.0) == pytest.approx(10.0)
    assert b.available(1000.0) == 60.0  # capped


def test_more_than_capacity_never_fits() -> None:
    b = TokenBucket(capacity=10, rate_per_s=1, now=0.0)
    assert math.isinf(b.wait_s(11, 0.0))


def test_take_without_tokens_is_an_error() -> None:
    b = TokenBucket(capacity=2, rate_per_s=1, now=0.0)
    b.take(2, 0.0)
    with pytest.raises(ValueError):
        b.take(1, 0.0)


def test_give_back_and_reconfigure_keep_fill() -> None:
    b = TokenBucket(capacity=10, rate_per_s=1, now=0.0)
    b.take(8, 0.0)
    b.give_back(3, 0.0)
    assert b.available(0.0) == 5.0
    b.reconfigure(capacity=4, rate_per_s=2, now=0.0)
    assert b.available(0.0) == 4.0
    b.take(4, 0.0)
    assert b.wait_s(2, 0.0) == pytest.approx(1.0)


def test_time_going_backwards_does_not_refill() -> None:
    b = TokenBucket(capacity=10, rate_per_s=1, now=5.0)
    b.take(10, 5.0)
    assert b.available(3.0) == 0.0


@pytest.mark.parametrize("capacity, rate", [(0, 1), (1, 0), (-1, 1)])
def test_invalid_configuration(capacity: float, rate: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(capacity=capacity, rate_per_s=rate, now=0.0)
