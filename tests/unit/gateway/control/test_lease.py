"""Lease arithmetic of planner leadership, literal values."""

from __future__ import annotations

import pytest

from gateway.control.lease import NO_LEASE, LeaseConfig, LeaseState, evaluate, may_act, newer_term
from gateway.store.records import LeaseRecord


def test_a_holder_may_act_for_the_ttl_less_its_margin_from_when_it_sent_the_claim() -> None:
    cfg = LeaseConfig(ttl_s=2.0, renew_s=0.5, drift=0.1)
    state = evaluate(LeaseRecord("g1", 4, 1.98), "g1", sent_at=100.0, config=cfg)
    assert state == LeaseState(leading=True, term=4, leader="g1", held_until=101.8)
    assert may_act(state, 100.0) and may_act(state, 101.79)
    assert not may_act(state, 101.8) and not may_act(state, 250.0)


def test_a_follower_learns_the_holder_and_term_and_may_not_act() -> None:
    cfg = LeaseConfig()
    state = evaluate(LeaseRecord("g2", 7, 1.2), "g1", sent_at=5.0, config=cfg)
    assert state == LeaseState(leading=False, term=7, leader="g2", held_until=0.0)
    assert not may_act(state, 5.0)


def test_an_expired_lease_has_no_leader_but_keeps_its_term() -> None:
    state = evaluate(LeaseRecord("g2", 7, -0.3), "g1", sent_at=5.0, config=LeaseConfig())
    assert (state.leader, state.term, state.leading) == (None, 7, False)
    # even its own expired record does not let a replica act
    mine = evaluate(LeaseRecord("g1", 7, 0.0), "g1", sent_at=5.0, config=LeaseConfig())
    assert not mine.leading and not may_act(mine, 5.0)
    assert NO_LEASE.term == 0 and not may_act(NO_LEASE, 0.0)


def test_failover_bound_is_ttl_plus_one_attempt_interval() -> None:
    assert LeaseConfig(ttl_s=2.0, renew_s=0.5).failover_bound_s == 2.5
    assert LeaseConfig(ttl_s=10.0, renew_s=5.0).failover_bound_s == 15.0


@pytest.mark.parametrize(
    ("ttl", "renew", "drift", "message"),
    [
        (0.0, 0.5, 0.1, "need ttl_s > 0"),
        (2.0, 0.0, 0.1, "need ttl_s > 0 and 0 < renew_s"),
        (2.0, 1.5, 0.1, "renew_s <= ttl_s / 2"),
        (2.0, 0.5, 0.5, r"drift must be in \[0, 0.5\)"),
        (2.0, 0.5, -0.1, r"drift must be in \[0, 0.5\)"),
    ],
)
def test_config_is_validated(ttl: float, renew: float, drift: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeaseConfig(ttl_s=ttl, renew_s=renew, drift=drift)


@pytest.mark.parametrize(("term", "seen", "newer"), [(2, 1, True), (1, 1, False), (0, 3, False), (10, 9, True)])
def test_term_comparison(term: int, seen: int, newer: bool) -> None:
    assert newer_term(term, seen) is newer
