"""CircuitBreaker over literal times."""

from __future__ import annotations

import pytest

from gateway.kv.circuit import CircuitBreaker


def test_open_after_a_failure_then_one_prober_then_closed() -> None:
    b = CircuitBreaker(initial_s=0.5, max_s=5.0)
    assert b.closed and b.allow(0.0)
    assert b.failure(10.0) == 10.5
    assert not b.allow(10.0) and not b.allow(10.49)
    assert b.allow(10.5)  # the prober
    assert not b.allow(10.6)  # the others keep their fallback while it probes
    b.success()
    assert b.closed and b.allow(10.7) and b.trips == 1


def test_backoff_doubles_per_consecutive_failure_up_to_the_cap() -> None:
    b = CircuitBreaker(initial_s=0.5, max_s=5.0)
    assert [b.backoff_s(n) for n in (1, 2, 3, 4, 5, 9)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.failure(0.0) == 0.5
    assert b.allow(0.5)
    assert b.failure(0.5) == 1.5  # the probe failed: 1 s now
    assert b.allow(1.5)
    assert b.failure(1.5) == 3.5
    assert b.trips == 1  # one outage, however many probes


@pytest.mark.parametrize(("initial", "cap"), [(0.0, 1.0), (2.0, 1.0)])
def test_config_is_validated(initial: float, cap: float) -> None:
    with pytest.raises(ValueError, match="need 0 < initial_s <= max_s"):
        CircuitBreaker(initial_s=initial, max_s=cap)
