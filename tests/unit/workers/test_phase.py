"""The worker's phase machine: every (state, event) pair, admission, and the phase helpers."""

from __future__ import annotations

import pytest

from core import Phase, Role
from workers.phase import (
    InvalidTransition,
    PhaseEvent,
    PhaseState,
    accepts,
    begin_event,
    from_phase,
    leaving_phase,
    next_state,
    stable_phase,
)

P, D = PhaseState.PREFILL, PhaseState.DECODE
TO_P, TO_D = PhaseState.DRAINING_TO_PREFILL, PhaseState.DRAINING_TO_DECODE
BEGIN_P, BEGIN_D = PhaseEvent.BEGIN_TO_PREFILL, PhaseEvent.BEGIN_TO_DECODE
DRAINED, CANCEL = PhaseEvent.DRAINED, PhaseEvent.CANCEL

# None: InvalidTransition.
TRANSITION_TABLE = [
    (P, BEGIN_P, None),
    (P, BEGIN_D, TO_D),
    (P, DRAINED, None),
    (P, CANCEL, None),
    (D, BEGIN_P, TO_P),
    (D, BEGIN_D, None),
    (D, DRAINED, None),
    (D, CANCEL, None),
    (TO_P, BEGIN_P, None),
    (TO_P, BEGIN_D, None),
    (TO_P, DRAINED, P),
    (TO_P, CANCEL, D),
    (TO_D, BEGIN_P, None),
    (TO_D, BEGIN_D, None),
    (TO_D, DRAINED, D),
    (TO_D, CANCEL, P),
]


def test_the_table_covers_every_pair_once() -> None:
    assert len({(s, e) for s, e, _ in TRANSITION_TABLE}) == len(PhaseState) * len(PhaseEvent) == 16


@pytest.mark.parametrize(("state", "event", "expected"), TRANSITION_TABLE)
def test_next_state(state: PhaseState, event: PhaseEvent, expected: PhaseState | None) -> None:
    if expected is not None:
        assert next_state(state, event) is expected
        return
    with pytest.raises(InvalidTransition) as exc:
        next_state(state, event)
    assert (exc.value.state, exc.value.event) == (state, event)


def test_invalid_transition_message_names_event_and_state() -> None:
    with pytest.raises(InvalidTransition, match="^cannot drained while prefill$"):
        next_state(P, DRAINED)


@pytest.mark.parametrize(
    ("state", "takes_prefill", "takes_decode"),
    [(P, True, True), (D, False, True), (TO_P, True, False), (TO_D, False, True)],
)
def test_accepts(state: PhaseState, takes_prefill: bool, takes_decode: bool) -> None:
    assert accepts(state, Role.PREFILL) is takes_prefill
    assert accepts(state, Role.DECODE) is takes_decode


@pytest.mark.parametrize(
    ("state", "stable", "leaving"),
    [
        (P, Phase.PREFILL, None),
        (D, Phase.DECODE, None),
        (TO_P, Phase.PREFILL, Phase.DECODE),
        (TO_D, Phase.DECODE, Phase.PREFILL),
    ],
)
def test_stable_and_leaving_phase(state: PhaseState, stable: Phase, leaving: Phase | None) -> None:
    assert stable_phase(state) is stable
    assert leaving_phase(state) is leaving


@pytest.mark.parametrize(("phase", "event", "state"), [(Phase.PREFILL, BEGIN_P, P), (Phase.DECODE, BEGIN_D, D)])
def test_begin_event_and_from_phase(phase: Phase, event: PhaseEvent, state: PhaseState) -> None:
    assert begin_event(phase) is event
    assert from_phase(phase) is state
