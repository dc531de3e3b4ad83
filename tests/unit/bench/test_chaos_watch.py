"""`bench chaos`'s detect_s: an engine's death to the gateway's own out-of-routing time."""

from __future__ import annotations

from bench._chaos_watch import DeathWatch


def watch(deaths, out_at) -> DeathWatch:
    w = DeathWatch(workers={}, registry=lambda: None)
    w.deaths, w.out_at = deaths, out_at
    return w


def test_the_longest_gap_over_the_engines_that_died():
    w = watch([("a", 100.0, 50.0), ("b", 200.0, 60.0)], {"a": [100.4], "b": [201.5]})
    assert w.detect_s() == 1.5
    assert w.first_death() == 100.0


def test_an_exit_before_the_engine_started_is_another_one():
    # b left routing at 150 (an earlier fault; this engine started at 160) and again at 200.7.
    w = watch([("b", 200.0, 160.0)], {"b": [150.0, 200.7]})
    assert round(w.detect_s() or 0, 3) == 0.7


def test_taken_out_before_the_core_exited_counts_as_zero():
    w = watch([("a", 100.0, 50.0)], {"a": [99.8]})  # the core reported its crash, then exited
    assert w.detect_s() == 0.0
    # seen in bench chaos: the core reported at 97.9; its process went when the worker shut it down, 2.1 s later
    assert watch([("a", 100.0, 50.0)], {"a": [97.9]}).gaps() == [-2.1]


def test_nothing_died_or_never_taken_out():
    assert watch([], {}).detect_s() is None
    assert watch([("a", 1.0, 0.5)], {}).detect_s() is None
