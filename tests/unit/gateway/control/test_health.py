"""The node-health rule and the poison-request quarantine (gateway.control.health)."""

from __future__ import annotations

import pytest

from gateway.control.health import NodeHealth, Quarantine, assess, request_fingerprint

H, D, U = NodeHealth.HEALTHY, NodeHealth.ENGINE_DEAD, NodeHealth.UNREACHABLE


@pytest.mark.parametrize(
    ("current", "answered", "engine_alive", "failures", "want"),
    [
        (U, True, True, 0, H),  # first heartbeat: in service
        (H, True, False, 0, D),  # process answers, engine gone: out at once
        (D, True, True, 0, H),  # restarted engine: back
        (H, False, False, 1, H),  # one slow beat of 3 keeps it
        (H, False, False, 3, U),  # the third missed beat takes it out
        (D, False, False, 1, D),  # a dead engine stays dead while the process is slow
        (D, False, False, 3, U),  # ...and becomes unreachable when the process is gone
    ],
)
def test_assess(current, answered, engine_alive, failures, want):
    assert assess(current, answered=answered, engine_alive=engine_alive, failures=failures, max_failures=3) is want


def test_assess_rejects_a_zero_limit():
    with pytest.raises(ValueError, match="max_failures"):
        assess(H, answered=False, engine_alive=False, failures=1, max_failures=0)


def test_fingerprint_tells_prompts_and_sampling_apart():
    a = request_fingerprint([1, 2, 3], '{"seed":1}')
    assert a == request_fingerprint([1, 2, 3], '{"seed":1}')
    assert a != request_fingerprint([1, 2, 4], '{"seed":1}')
    assert a != request_fingerprint([1, 2, 3], '{"seed":2}')
    assert request_fingerprint([1, 23], "") != request_fingerprint([12, 3], "")  # no ambiguous joins


def test_second_engine_death_makes_a_poison_request():
    q = Quarantine(max_engine_deaths=2)
    assert not q.is_poison("r")
    assert q.record_death("r") == 1 and not q.is_poison("r")
    assert q.record_death("r") == 2 and q.is_poison("r")
    assert q.quarantined == 1
    assert not q.is_poison("other")


def test_quarantine_forgets_the_oldest_beyond_capacity():
    q = Quarantine(max_engine_deaths=1, capacity=2)
    for fp in ("a", "b", "c"):
        q.record_death(fp)
    assert not q.is_poison("a") and q.is_poison("b") and q.is_poison("c")


def test_quarantine_config_is_validated():
    with pytest.raises(ValueError, match="max_engine_deaths and capacity must be >= 1"):
        Quarantine(max_engine_deaths=0)


def test_acquit_forgets_a_suspect_but_never_a_poison_request():
    q = Quarantine(max_engine_deaths=2)
    q.record_death("bystander")
    q.acquit("bystander")  # it finished on another engine
    assert q.deaths("bystander") == 0
    q.record_death("bystander")  # a later, unrelated death: one again, not poison
    assert not q.is_poison("bystander")
    q.record_death("p")
    q.record_death("p")
    q.acquit("p")
    assert q.is_poison("p")
