"""TermFence: orders of a superseded leadership term are refused, literal terms."""

from __future__ import annotations

import pytest

from workers.fence import StaleTerm, TermFence


def test_newest_term_wins_and_equal_terms_are_the_same_leader() -> None:
    f = TermFence()
    f.admit(3)
    f.admit(3)
    assert (f.newest, f.accepted, f.refused) == (3, 2, 0)
    with pytest.raises(StaleTerm) as exc:
        f.admit(2)
    assert (exc.value.term, exc.value.newest) == (2, 3)
    assert "term 2 refused" in str(exc.value) and "term 3" in str(exc.value)
    f.admit(4)
    assert (f.newest, f.accepted, f.refused) == (4, 3, 1)


def test_observe_raises_the_fence_without_an_order() -> None:
    f = TermFence()
    assert f.observe(7) == 7
    assert f.observe(5) == 7  # never goes back
    assert f.observe(None) == 7
    with pytest.raises(StaleTerm):
        f.admit(6)
    f.admit(7)
    assert (f.accepted, f.refused) == (1, 1)


@pytest.mark.parametrize(
    ("seen", "order", "accepted"),
    [(0, None, True), (0, 0, True), (1, None, False), (1, 0, False), (1, 1, True), (9, 10, True)],
)
def test_an_order_without_a_term_counts_as_term_0(seen: int, order: int | None, accepted: bool) -> None:
    f = TermFence(newest=seen)
    if accepted:
        f.admit(order)
        assert f.newest == max(seen, order or 0)
    else:
        with pytest.raises(StaleTerm):
            f.admit(order)
        assert f.newest == seen
