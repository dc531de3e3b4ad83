"""The worker's phase as a small pure state machine.

States: PREFILL, DECODE, DRAINING_TO_PREFILL, DRAINING_TO_DECODE. One table
says which events move between them; anything else is `InvalidTransition`.
Admission says which request roles a state takes: a draining node already
takes its *target* role (so a switch never refuses work the cluster routes
to it after the flip) and refuses the role it is leaving. A prefill node also
takes a whole request (the decode role, computing its own prompt): the router
sends one there only when no decode node is left (routing.picker.route, e.g.
an operator pinned every node to prefill), and refusing it left such a
cluster answering 503 "no healthy worker" with healthy workers.
"""

from __future__ import annotations

import enum

from core import Phase, Role


class PhaseState(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    DRAINING_TO_PREFILL = "draining_to_prefill"
    DRAINING_TO_DECODE = "draining_to_decode"


class PhaseEvent(str, enum.Enum):
    BEGIN_TO_PREFILL = "begin_to_prefill"
    BEGIN_TO_DECODE = "begin_to_decode"
    DRAINED = "drained"
    CANCEL = "cancel"


class InvalidTransition(Exception):
    def __init__(self, state: PhaseState, event: PhaseEvent) -> None:
        super().__init__(f"cannot {event.value} while {state.value}")
        self.state, self.event = state, event


_S, _E = PhaseState, PhaseEvent
TRANSITIONS: dict[tuple[PhaseState, PhaseEvent], PhaseState] = {
    (_S.PREFILL, _E.BEGIN_TO_DECODE): _S.DRAINING_TO_DECODE,
    (_S.DECODE, _E.BEGIN_TO_PREFILL): _S.DRAINING_TO_PREFILL,
    (_S.DRAINING_TO_DECODE, _E.DRAINED): _S.DECODE,
    (_S.DRAINING_TO_PREFILL, _E.DRAINED): _S.PREFILL,
    (_S.DRAINING_TO_DECODE, _E.CANCEL): _S.PREFILL,
    (_S.DRAINING_TO_PREFILL, _E.CANCEL): _S.DECODE,
}

_ACCEPTS: dict[PhaseState, frozenset[Role]] = {
    _S.PREFILL: frozenset({Role.PREFILL, Role.DECODE}),
    _S.DECODE: frozenset({Role.DECODE}),
    _S.DRAINING_TO_DECODE: frozenset({Role.DECODE}),
    _S.DRAINING_TO_PREFILL: frozenset({Role.PREFILL}),
}


def next_state(state: PhaseState, event: PhaseEvent) -> PhaseState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(state, event) from None


def begin_event(to: Phase) -> PhaseEvent:
    return PhaseEvent.BEGIN_TO_PREFILL if to is Phase.PREFILL else PhaseEvent.BEGIN_TO_DECODE


def accepts(state: PhaseState, role: Role) -> bool:
    return role in _ACCEPTS[state]


def stable_phase(state: PhaseState) -> Phase:
    """The phase a state serves as (a draining node serves its target)."""
    return {
        _S.PREFILL: Phase.PREFILL,
        _S.DECODE: Phase.DECODE,
        _S.DRAINING_TO_DECODE: Phase.DECODE,
        _S.DRAINING_TO_PREFILL: Phase.PREFILL,
    }[state]


def leaving_phase(state: PhaseState) -> Phase | None:
    """The phase being drained, or None when stable."""
    return {_S.DRAINING_TO_DECODE: Phase.PREFILL, _S.DRAINING_TO_PREFILL: Phase.DECODE}.get(state)


def from_phase(phase: Phase) -> PhaseState:
    return PhaseState.PREFILL if phase is Phase.PREFILL else PhaseState.DECODE
