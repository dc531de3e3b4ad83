"""Property tests: whatever the cluster, planners never move protected nodes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core import Phase
from planner.evolving import EvolvingConfig, EvolvingPlanner
from planner.profile import Profile
from planner.types import ClusterView, NodeState, Pin
from testing.planner_records import synthetic_records, synthetic_samples

_PROFILE = Profile.from_coefficients((10.0, 0.05, 0.002, 0.01), (10.0, 0.5, 0.0002))
_SAMPLES = synthetic_samples(0, 200, 3.0, uncached=3000, cached=5000, output=300, seed=4, local_share=0.2)

nodes_st = st.lists(
    st.tuples(st.sampled_from(list(Phase)), st.booleans(), st.booleans(), st.integers(0, 9)),
    min_size=2,
    max_size=24,
)


@settings(max_examples=60, deadline=None, database=None)
@given(nodes=nodes_st, split_pin=st.one_of(st.none(), st.integers(0, 24)))
def test_actions_never_touch_pinned_or_draining(
    nodes: list[tuple[Phase, bool, bool, int]], split_pin: int | None
) -> None:
    planner = EvolvingPlanner(EvolvingConfig(cooldown_s=0.0), _PROFILE)
    planner.observe_requests(_SAMPLES)
    states = tuple(
        NodeState(f"n{i}", phase, pinned=pinned, draining=draining, queue=q)
        for i, (phase, pinned, draining, q) in enumerate(nodes)
    )
    d = planner.decide(
        ClusterView(now=200.0, nodes=states, pin=Pin(prefill_nodes=split_pin) if split_pin is not None else None)
    )
    by_id = {n.node_id: n for n in states}
    for a in d.actions:
        node = by_id[a.node_id]
        assert not node.pinned and not node.draining and node.phase != a.to_phase
    assert len({a.node_id for a in d.actions}) == len(d.actions)
    assert sum(d.chosen_split) == len(states) and min(d.chosen_split) >= 0
    if d.acted and split_pin is None:
        assert d.chosen_split[1] >= 1  # never drops the last decode node on its own


def test_planner_learns_profile_from_iterations() -> None:
    planner = EvolvingPlanner()
    assert not planner.profile.ready
    planner.observe_iterations(synthetic_records(100, seed=5))
    assert planner.profile.ready
