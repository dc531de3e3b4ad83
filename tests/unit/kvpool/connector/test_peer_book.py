"""PeerBook: the peer state machine, every (state, event), and the backoff."""

from __future__ import annotations

import pytest

from kvpool.connector.peer_book import (
    PEER_TRANSITIONS,
    Backoff,
    InvalidPeerTransition,
    PeerBook,
    PeerState,
)


def test_transition_table_covers_every_state() -> None:
    assert set(PEER_TRANSITIONS) == set(PeerState)
    assert PEER_TRANSITIONS[PeerState.UP] == {PeerState.DOWN}
    assert PEER_TRANSITIONS[PeerState.DOWN] == {PeerState.UP, PeerState.DOWN}


def test_unknown_peers_are_usable_and_not_listed() -> None:
    book = PeerBook()
    assert book.usable("a")
    assert book.records() == []
    assert book.due(100.0) == []


def test_a_failure_takes_the_peer_down_once() -> None:
    book = PeerBook(Backoff(first_s=0.5, max_s=4.0))
    assert book.failed("a", 10.0, "timeout") is True
    assert not book.usable("a")
    assert book.failed("a", 10.1, "unavailable") is False  # a second load failing together
    rec = book.record("a")
    assert (rec.state, rec.reason, rec.down_since, rec.next_try, rec.downs) == (
        PeerState.DOWN,
        "unavailable",
        10.0,
        10.5,
        1,
    )


def test_due_lists_down_peers_whose_try_has_come_longest_waiting_first() -> None:
    book = PeerBook(Backoff(first_s=1.0))
    book.failed("b", 0.0, "timeout")
    book.failed("a", 0.5, "timeout")
    assert book.due(0.9) == []
    assert book.due(1.0) == ["b"]
    assert book.due(1.5) == ["b", "a"]


def test_failed_tries_back_off_up_to_the_cap() -> None:
    book = PeerBook(Backoff(first_s=0.5, max_s=4.0, factor=2.0))
    book.failed("a", 0.0, "timeout")
    waits = []
    now = 0.5
    for _ in range(5):
        book.retry_failed("a", now, "unreachable")
        waits.append(book.record("a").next_try - now)
        now = book.record("a").next_try
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert book.record("a").tries == 5


def test_postpone_moves_the_next_try_without_counting_a_failure() -> None:
    book = PeerBook(Backoff(first_s=0.5))
    book.failed("a", 0.0, "timeout")
    book.postpone("a", 0.5, 0.25)
    assert (book.record("a").next_try, book.record("a").tries) == (0.75, 0)
    book.postpone("up-peer", 0.5, 0.25)  # an up peer has no next try
    assert book.record("up-peer").next_try == 0.0


def test_reconnected_returns_the_time_down_and_resets() -> None:
    book = PeerBook()
    book.failed("a", 2.0, "timeout")
    book.retry_failed("a", 2.5, "unreachable")
    assert book.reconnected("a", 7.5) == pytest.approx(5.5)
    rec = book.record("a")
    assert (rec.state, rec.tries, rec.down_since, rec.reconnects) == (PeerState.UP, 0, None, 1)
    assert book.usable("a") and book.due(100.0) == []


def test_up_peers_cannot_reconnect() -> None:
    book = PeerBook()
    book.record("a")
    with pytest.raises(InvalidPeerTransition):
        book.reconnected("a", 1.0)


@pytest.mark.parametrize("kw", [{"first_s": 0}, {"first_s": 2.0, "max_s": 1.0}, {"factor": 0.5}])
def test_backoff_validates(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="invalid Backoff"):
        Backoff(**kw)
