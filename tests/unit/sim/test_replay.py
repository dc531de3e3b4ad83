"""Replaying a trace at any load: replicated sessions, seeded offsets, no shared blocks, cuts."""

from __future__ import annotations

import pytest

from sim import replay
from sim.sessions import sessionize


def _trace():
    raw = [
        (0.0, "a", 600, 10, (1, 2)),
        (3.0, "a", 1200, 10, (1, 2, 3)),
        (10.0, "b", 600, 10, (1, 4)),
        (20.0, None, 100, 5, ()),
    ]
    return sessionize(raw, "t", True, 512)


def test_load_two_is_twice_the_sessions_with_copies_sharing_no_blocks() -> None:
    wl = _trace()
    two = replay.scale(wl, load=2, seed=1)
    assert len(two.requests) == 8 and two.duration_s == wl.duration_s
    assert [r.req_id for r in two.requests] == list(range(8))
    originals = [r for r in two.requests if "~" not in r.session_id]
    copies = [r for r in two.requests if r.session_id.endswith("~1")]
    assert sorted((r.arrival_s, r.prompt_tokens) for r in originals) == [
        (r.arrival_s, r.prompt_tokens) for r in wl.requests
    ]  # copy 0 keeps the trace's times
    assert len(copies) == 4 and not {h for r in originals for h in r.block_hashes} & {
        h for r in copies for h in r.block_hashes
    }
    a0, a1 = (r for r in copies if r.session_id == "a~1")
    assert a1.after == (a0.req_id,) and a1.block_hashes[:2] == a0.block_hashes  # a copy keeps its own prefix chain
    assert a1.arrival_s - a0.arrival_s == pytest.approx(3.0)  # a session moves as a whole
    assert all(0 <= r.arrival_s < wl.duration_s + 3.0 for r in two.requests)
    assert two == replay.scale(wl, load=2, seed=1) and two != replay.scale(wl, load=2, seed=2)
    assert "load 2: 2 copies of 3 sessions" in two.notes[0]


def test_fractional_load_keeps_whole_sessions() -> None:
    wl = _trace()
    half = replay.scale(wl, load=0.5, seed=3)
    sessions = {r.session_id for r in half.requests}
    assert sessions < {"a", "b", "r3"}
    for s in sessions:
        assert [r.prompt_tokens for r in half.requests if r.session_id == s] == [
            r.prompt_tokens for r in wl.requests if r.session_id == s
        ]
    many = replay.scale(wl, load=1000.5, seed=0)
    assert 3000 < len({r.session_id for r in many.requests}) < 3004


def test_window_spreads_copies_and_cut_drops_late_roots_with_their_turns() -> None:
    wl = _trace()
    spread = replay.scale(wl, load=50, seed=0, window_s=600.0)
    starts = [r.arrival_s for r in spread.requests if not r.after]
    assert spread.duration_s == 600.0 and max(starts) > 300 and min(starts) < 300
    cut = replay.cut(spread, 100.0)
    assert cut.duration_s == 100.0 and all(r.arrival_s < 100.0 for r in cut.requests if not r.after)
    kept = {r.req_id for r in cut.requests}
    assert all(set(r.after) <= kept for r in cut.requests) and [r.req_id for r in cut.requests] == sorted(kept)
    assert "cut at 100 s" in cut.notes[-1]
    longer = replay.cut(wl, 500.0)
    assert longer.requests == wl.requests and longer.duration_s == 500.0  # a longer horizon


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_bad_load_and_duration_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="load must be a positive number"):
        replay.scale(_trace(), load=bad, seed=0)
    with pytest.raises(ValueError, match="duration must be a positive number"):
        replay.cut(_trace(), bad)
