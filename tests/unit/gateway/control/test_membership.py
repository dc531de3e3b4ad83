"""Membership's count: what heartbeats saw over the last ttl, kept across a
Redis outage until everyone has had a beat's chance to register again."""

from __future__ import annotations

from gateway.control.membership import Membership


def membership(expected: int = 3) -> Membership:
    return Membership(None, "p", "a", expected=expected, interval_s=1.0, ttl_s=3.0)  # type: ignore[arg-type]  # no beat runs


def test_expected_until_a_heartbeat_answers() -> None:
    m = membership(expected=3)
    assert m.count() == 3
    m.saw(["a", "b"], now=10.0)
    assert m.count() == 2


def test_a_replica_that_stops_beating_leaves_after_ttl() -> None:
    m = membership()
    m.saw(["a", "b"], now=10.0)
    m.saw(["a"], now=11.0)  # b's entry lapsed in Redis or b stopped
    assert m.count() == 2  # seen 1 s ago
    m.saw(["a"], now=13.5)
    assert m.count() == 1


def test_redis_restarted_empty_does_not_shrink_the_count() -> None:
    m = membership()
    m.saw(["a", "b"], now=10.0)
    m.lost()  # beats fail for 8 s: Redis is down
    m.saw(["a"], now=18.0)  # restarted empty: only this replica has beaten yet
    assert m.count() == 2
    m.saw(["a", "b"], now=19.0)
    assert m.count() == 2
    m.saw(["a"], now=22.5)  # b really gone: out one ttl after it was last seen
    assert m.count() == 1


def test_without_the_outage_mark_the_old_member_lapses() -> None:
    m = membership()
    m.saw(["a", "b"], now=10.0)
    m.saw(["a"], now=18.0)  # no failed beat between: b was last seen 8 s ago
    assert m.count() == 1
