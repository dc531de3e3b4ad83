"""planner.decision: the pure decision rule, over literal estimates and node states."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core import Phase
from planner.decision import (
    best_split,
    choose_nodes,
    gain_fraction,
    move_actions,
    net_gain,
    node_pin_actions,
    normal_confidence,
    pin_actions,
    protected_ids,
    reachable,
    slo_bounds,
    split_after,
)
from planner.estimator import SplitEstimate
from planner.types import SLO, NodeState, Pin, SwitchAction
from testing.planner_records import literal_estimate

P, D = Phase.PREFILL, Phase.DECODE


def _est(prefill: list[int], total: int = 4, **arrays: list[float]) -> SplitEstimate:
    return literal_estimate(prefill, total, **arrays)


def test_net_gain_is_gain_times_horizon_minus_cost_with_its_lower_bound() -> None:
    est = _est([1, 2, 3], gain_rps=[1.0, -0.5, 2.0], gain_sd_rps=[0.1, 0.0, 0.5])
    net = net_gain(est, np.array([10.0, 0.0, 30.0]), horizon_s=100.0, z=2.0)
    np.testing.assert_allclose(net.mean, [90.0, -50.0, 170.0])
    np.testing.assert_allclose(net.sd, [10.0, 0.0, 50.0])
    np.testing.assert_allclose(net.lcb, [70.0, -50.0, 70.0])


@pytest.mark.parametrize(
    ("net", "capacity", "horizon", "expected"),
    [
        (50.0, 10.0, 100.0, 0.05),
        (-100.0, 2.0, 100.0, -0.5),
        (0.0, 10.0, 100.0, 0.0),
        (5.0, 0.0, 100.0, math.inf),  # the current split serves nothing
        (0.0, 0.0, 100.0, 0.0),
        (-3.0, 0.0, 100.0, 0.0),
        (5.0, -1.0, 100.0, math.inf),
        (5.0, math.inf, 100.0, math.inf),
        (-5.0, math.inf, 100.0, 0.0),
    ],
)
def test_gain_fraction(net: float, capacity: float, horizon: float, expected: float) -> None:
    assert gain_fraction(net, capacity, horizon) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mean", "sd", "expected"),
    [
        (0.0, 1.0, 0.5),
        (1.0, 1.0, 0.8413447460685429),
        (-1.0, 1.0, 0.15865525393145707),
        (4.0, 2.0, 0.9772498680518208),
        (1.0, 0.0, 1.0),  # no spread: certain either way
        (0.0, 0.0, 0.0),
        (-1.0, 0.0, 0.0),
        (1.0, -1.0, 1.0),
    ],
)
def test_normal_confidence(mean: float, sd: float, expected: float) -> None:
    assert normal_confidence(mean, sd) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("arrays", "margin", "z", "bounds"),
    [
        ({"ttft_s": [5.0, 1.5, 0.5], "tpot_s": [0.1, 0.15, 0.3]}, 1.0, 0.0, (2, 2)),
        ({"ttft_s": [5.0, 1.5, 0.5], "tpot_s": [0.1, 0.15, 0.18]}, 1.0, 0.0, (2, 3)),
        # z·sd lifts split 2's TTFT over the SLO; the floor then wins over the ceiling
        ({"ttft_s": [5.0, 1.5, 0.5], "ttft_sd_s": [0.0, 0.5, 0.0], "tpot_s": [0.1, 0.15, 0.3]}, 1.0, 2.0, (3, 3)),
        # margin 0.5: TTFT ≤ 1.0, TPOT ≤ 0.1
        ({"ttft_s": [5.0, 1.5, 0.5], "tpot_s": [0.05, 0.15, 0.3]}, 0.5, 0.0, (3, 3)),
        # no split meets either SLO: no bound
        ({"ttft_s": [9.0, 9.0, 9.0], "tpot_s": [1.0, 1.0, 1.0]}, 1.0, 0.0, (1, 3)),
    ],
)
def test_slo_bounds(arrays: dict[str, list[float]], margin: float, z: float, bounds: tuple[int, int]) -> None:
    est = _est([1, 2, 3], 4, **arrays)
    assert slo_bounds(est, SLO(ttft_s=2.0, tpot_s=0.2), margin, z) == bounds


@pytest.mark.parametrize(
    ("score", "allowed", "current", "expected"),
    [
        ([1.0, 3.0, 3.0, 2.0], [1, 1, 1, 1], 3, 3),  # tie: the current split
        ([1.0, 3.0, 3.0, 2.0], [1, 1, 1, 1], 1, 2),  # tie: nearest the current split
        ([1.0, 3.0, 3.0, 2.0], [1, 1, 1, 1], 4, 3),
        ([1.0, 3.0, 3.0, 2.0], [1, 0, 0, 1], 2, 4),  # best of the allowed only
        ([3.0, 3.0 - 1e-12, 0.0, 0.0], [1, 1, 1, 1], 2, 2),  # within the tie tolerance
        ([3.0, 2.9, 0.0, 0.0], [1, 1, 1, 1], 2, 1),
        ([1.0, 3.0, 3.0, 2.0], [0, 0, 0, 0], 2, None),
    ],
)
def test_best_split(score: list[float], allowed: list[int], current: int, expected: int | None) -> None:
    est = _est([1, 2, 3, 4], total=5)
    assert best_split(est, np.array(score), np.array(allowed, dtype=bool), current) == expected


NODES = [
    NodeState("a", P, pinned=True),
    NodeState("b", D, draining=True),
    NodeState("c", D),
    NodeState("d", P),
]


@pytest.mark.parametrize(
    ("pin", "expected"),
    [
        (None, {"a", "b"}),
        (Pin(prefill_nodes=1), {"a", "b"}),
        (Pin(node_phases={"d": D, "zz": P}), {"a", "b", "d"}),
    ],
)
def test_protected_ids(pin: Pin | None, expected: set[str]) -> None:
    assert protected_ids(NODES, pin) == expected


@pytest.mark.parametrize(
    ("pin", "expected"),
    [
        (None, []),
        (Pin(prefill_nodes=2), []),
        # a and c move; b drains; d is already there; zz is unknown
        (
            Pin(node_phases={"zz": D, "d": P, "c": P, "b": P, "a": D}),
            [SwitchAction("a", D), SwitchAction("c", P)],
        ),
    ],
)
def test_node_pin_actions(pin: Pin | None, expected: list[SwitchAction]) -> None:
    assert node_pin_actions(NODES, pin) == expected


@pytest.mark.parametrize(
    ("pin", "expected"),
    [
        (None, []),
        (Pin(node_phases={"a": D}), [("a", D)]),
        # the split pin takes the least loaded decode node (c waits 3, b 0)
        (Pin(prefill_nodes=2), [("b", P)]),
        (Pin(prefill_nodes=0), [("a", D)]),
        # a pinned to prefill cannot be moved by the split pin
        (Pin(prefill_nodes=0, node_phases={"a": P}), []),
        # node pins first; the split pin then counts b as decode and moves c
        (Pin(prefill_nodes=2, node_phases={"b": D}), [("c", P)]),
        # only as far as unpinned nodes allow
        (Pin(prefill_nodes=3, node_phases={"b": D}), [("c", P)]),
    ],
)
def test_pin_actions_node_pins_then_the_split_pin(pin: Pin | None, expected: list[tuple[str, Phase]]) -> None:
    nodes = [NodeState("a", P), NodeState("b", D), NodeState("c", D, queue=3)]
    assert pin_actions(nodes, pin) == [SwitchAction(n, p) for n, p in expected]


def test_the_split_pin_waits_while_a_node_drains() -> None:
    # c drains to prefill (it still reports decode): counting it as decode would move b too
    nodes = [NodeState("a", P), NodeState("b", D), NodeState("c", D, draining=True), NodeState("d", D)]
    assert pin_actions(nodes, Pin(prefill_nodes=2)) == []
    # node pins of the other nodes do not wait
    assert pin_actions(nodes, Pin(prefill_nodes=2, node_phases={"d": P})) == [SwitchAction("d", P)]
    settled = [NodeState("a", P), NodeState("b", D), NodeState("c", P), NodeState("d", D)]
    assert pin_actions(settled, Pin(prefill_nodes=3)) == [SwitchAction("b", P)]


def test_reachable_counts_only_unprotected_nodes() -> None:
    nodes = [NodeState("a", P), NodeState("b", P), NodeState("c", D), NodeState("d", D), NodeState("e", D)]
    assert reachable(nodes, 2, {"b", "e"}) == (1, 4)
    assert reachable(nodes, 2, set()) == (0, 5)
    assert reachable(nodes, 2, {"a", "b", "c", "d", "e"}) == (2, 2)


LOADED = [
    NodeState("c", D, queue=2, running=1, kv_usage=0.1),
    NodeState("d", D, queue=0, running=1, kv_usage=0.9),
    NodeState("f", D, queue=1, running=0, kv_usage=0.2),
    NodeState("e", D, queue=1, running=0, kv_usage=0.2),
    NodeState("p", P),
]


@pytest.mark.parametrize(
    ("phase", "count", "protected", "expected"),
    [
        (D, 3, set(), ["e", "f", "d"]),  # fewest requests, then least KV, then id
        (D, 9, set(), ["e", "f", "d", "c"]),
        (D, 9, {"e", "d"}, ["f", "c"]),
        (D, 0, set(), []),
        (D, -1, set(), []),
        (P, 2, set(), ["p"]),
    ],
)
def test_choose_nodes(phase: Phase, count: int, protected: set[str], expected: list[str]) -> None:
    assert choose_nodes(LOADED, phase, count, protected) == expected


@pytest.mark.parametrize(
    ("current", "target", "protected", "expected"),
    [
        (1, 1, set(), ()),
        (1, 3, set(), (SwitchAction("e", P), SwitchAction("f", P))),
        (1, 3, {"e"}, (SwitchAction("f", P), SwitchAction("d", P))),
        (1, 0, set(), (SwitchAction("p", D),)),
        (1, 0, {"p"}, ()),
        (1, -1, set(), (SwitchAction("p", D),)),  # as far as movable nodes allow
    ],
)
def test_move_actions(current: int, target: int, protected: set[str], expected: tuple[SwitchAction, ...]) -> None:
    assert move_actions(LOADED, current, target, protected) == expected


@pytest.mark.parametrize(
    ("actions", "expected"),
    [
        ([], (2, 2)),
        ([SwitchAction("c", P)], (3, 1)),
        ([SwitchAction("a", D), SwitchAction("b", D)], (0, 4)),
        ([SwitchAction("a", P), SwitchAction("zz", D)], (2, 2)),  # already there; unknown node
        ([SwitchAction("c", P), SwitchAction("a", D)], (2, 2)),
    ],
)
def test_split_after(actions: list[SwitchAction], expected: tuple[int, int]) -> None:
    nodes = [NodeState("a", P), NodeState("b", P), NodeState("c", D), NodeState("d", D)]
    assert split_after((2, 2), actions, nodes) == expected
