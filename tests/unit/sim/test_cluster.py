"""Workload structure, determinism for a seed, and a small end-to-end cluster run."""

from __future__ import annotations

from dataclasses import dataclass

from core import Phase
from planner.types import ClusterView, Decision, SwitchAction
from sim import workloads
from sim.cluster import Cluster, NodeStatus, SimConfig
from sim.profiles import GpuProfile


def test_agent_turns_grow_append_only_and_depend_on_previous() -> None:
    w = workloads.constant("coding", duration_s=600, seed=1, concurrency=2)
    by_branch: dict[str, list[workloads.Request]] = {}
    for r in w.requests:
        by_branch.setdefault(r.branch_id, []).append(r)
    turns = max(by_branch.values(), key=len)
    for prev, cur in zip(turns, turns[1:], strict=False):
        assert cur.after == (prev.req_id,)
        assert cur.prompt_tokens > prev.prompt_tokens
        assert cur.block_hashes[: len(prev.block_hashes)] == prev.block_hashes
    assert turns[-1].last_in_branch and not turns[0].last_in_branch


def test_burst_children_share_parent_prefix() -> None:
    w = workloads.subagent_burst(seed=2, duration_s=1_800, background=2, fanout=8)
    kids = [r for r in w.requests if r.parent_branch_id]
    assert len({r.branch_id for r in kids}) == 8
    parent = w.by_id()[kids[0].after[0]]
    assert kids[0].block_hashes[: len(parent.block_hashes)] == parent.block_hashes


def test_generators_deterministic_for_a_seed() -> None:
    a = workloads.shift(seed=5, duration_s=900, concurrency=8)
    b = workloads.shift(seed=5, duration_s=900, concurrency=8)
    c = workloads.shift(seed=6, duration_s=900, concurrency=8)
    assert a.requests == b.requests and a.requests != c.requests


@dataclass
class FlipOnce:
    """Stand-in planner: moves one decode node to prefill at the first tick."""

    name: str = "flip"
    done: bool = False

    def observe_iterations(self, records) -> None:
        pass

    def observe_requests(self, samples) -> None:
        pass

    def decide(self, view: ClusterView) -> Decision:
        acts = () if self.done else (SwitchAction(view.nodes[-1].node_id, Phase.PREFILL),)
        self.done = True
        return Decision(view.now, self.name, (0, 0), (0, 0), acts, bool(acts), "test")


def _run(planner, directory: str = "memory") -> dict:
    w = workloads.shift(seed=1, duration_s=300, concurrency=24)
    # directory: the backend's name as a plain str; SimConfig declares the Literal.
    cfg = SimConfig(nodes=4, prefill_nodes=1, seed=1, directory=directory)  # type: ignore[arg-type]
    return Cluster(w, GpuProfile.from_json(), planner, cfg).run().summary()


def test_cluster_run_is_deterministic_and_switches_in_place() -> None:
    a, b = _run(FlipOnce()), _run(FlipOnce())
    assert a == b
    assert a["completed"] > 50 and a["switches"] == 1
    assert 1.0 <= a["mean_switch_s"] < 30.0  # drain/migrate + 1 s flip, not a relaunch
    assert a["split_over_time"][-1][1:3] == [2, 2]


def test_local_index_matches_real_directory_on_hits() -> None:
    a, b = _run(None, "memory"), _run(None, "local")
    assert a["completed"] == b["completed"]


def test_router_view_matches_node_state_and_follows_switches() -> None:
    w = workloads.shift(seed=1, duration_s=120, concurrency=24)
    cluster = Cluster(w, GpuProfile.from_json(), FlipOnce(), SimConfig(nodes=4, prefill_nodes=1, seed=1))
    before = {n.node_id for n in cluster._candidates(None)}
    cluster.run()
    for n in cluster.nodes.values():
        load = n.load()
        if n.phase is Phase.PREFILL:
            expected = (n.prefill.waiting, 1 if n.prefill.running else 0)
        else:
            expected = (len(n.decode.waiting) + len(n.decode.transit), len(n.decode.batch))
        assert (load.phase, load.queue, load.running) == (n.phase.value, *expected)
        assert load.kv_usage == min(1.0, n.decode.kv_used / n.cfg.kv_capacity_tokens)
    after = cluster._candidates(None)
    assert {c.node_id for c in after} == before == set(cluster.nodes)
    assert sorted(c.phase for c in after) == ["decode", "decode", "prefill", "prefill"]  # the flip is seen
    leaving = cluster.nodes["n0003"]
    leaving.set_status(NodeStatus.DRAINING)  # the cached serving list must drop it at once
    assert "n0003" not in {c.node_id for c in cluster._candidates(None)}


def test_oracle_with_one_segment_is_the_best_static_split_and_more_segments_do_no_worse() -> None:
    from sim.cli import oracle_search, simulate
    from sim.profiles import DEFAULT_PROFILE
    from sim.scenarios import build

    sc = build("shift", seed=1, nodes=4, duration_s=600, scale=0.25)
    report = simulate(sc, ["static-best"], seed=1, profile=str(DEFAULT_PROFILE), jobs=1, extra={"directory": "local"})
    best = report["results"]["static_best"]
    one = oracle_search(sc, seed=1, profile=str(DEFAULT_PROFILE), jobs=1, extra={"directory": "local"}, segments=1)
    assert one["schedule"] == [[0.0, best["split"][0]]]
    assert one["completed"] == best["completed"] and one["switches"] == 0
    two = oracle_search(sc, seed=1, profile=str(DEFAULT_PROFILE), jobs=1, extra={"directory": "local"}, segments=2)
    assert [t for t, _ in two["schedule"]] == [0.0, 300.0]
    # The second segment may keep the first one's split, so greedy never loses to its own prefix.
    assert two["completed"] >= one["completed"] or two["schedule"][0][1] != one["schedule"][0][1]


def test_fixed_4p5d_mix_picks_the_agents_and_only_applies_there() -> None:
    import pytest

    from sim.scenarios import build

    cu = build("fixed-4p5d", seed=0, duration_s=120, scale=0.1, mix="cu")
    assert {r.kind for r in cu.workload.requests} == {"cu"} and (cu.nodes, cu.prefill_nodes) == (9, 4)
    assert {r.kind for r in build("fixed-4p5d", seed=0, duration_s=120, scale=0.1).workload.requests} == {"coding"}
    with pytest.raises(ValueError, match="fixed-4p5d only"):
        build("shift", seed=0, mix="cu")
    with pytest.raises(ValueError, match="unknown mix"):
        build("fixed-4p5d", seed=0, mix="video")


def test_a_queued_prompt_finds_at_scheduling_the_prefix_computed_on_its_node_meanwhile() -> None:
    # Two one-chunk prompts (16 blocks of 512 tokens: the 8,192-token budget) of one
    # 14-block prefix, the second arriving while the first computes: nothing is
    # published when it is routed (no hit then), but vLLM asks its prefix cache
    # when it schedules it, after the first.
    from sim.workloads import Request, Workload

    bt = 512
    shared = tuple(range(14))
    reqs = tuple(
        Request(i, f"s{i}", f"b{i}", 0.001 * i, 16 * bt, 8, shared + tuple(100 * (i + 1) + k for k in range(2)))
        for i in range(2)
    )
    w = Workload("t", reqs, duration_s=60.0, block_tokens=bt, closed_loop=False)
    cfg = SimConfig(nodes=2, prefill_nodes=1, seed=0, directory="local")
    cluster = Cluster(w, GpuProfile.from_json(), None, cfg)
    seen: list[tuple[int, int]] = []
    done = cluster._finish

    def record(sr, now):
        seen.append((sr.req.req_id, sr.cached))
        done(sr, now)

    # Records the finished requests instead of the cluster's own bookkeeping.
    cluster._finish = record  # type: ignore[method-assign]
    cluster.run()
    assert sorted(seen) == [(0, 0), (1, 14 * bt)]


def test_the_decode_node_is_picked_when_the_prefill_is_done_on_the_loads_then() -> None:
    # 1P2D, twelve 4,096-token prompts at once. At arrival both decode nodes are empty
    # (every request is still queued for prefill), so a pick then sends all twelve to
    # one of them; the gateway picks when the prefill ends, seeing the decodes already
    # running, and spreads them.
    from sim.workloads import Request, Workload

    bt = 512
    reqs = tuple(
        Request(i, f"s{i}", f"b{i}", 0.001 * i, 8 * bt, 200, tuple(1000 * (i + 1) + k for k in range(8)))
        for i in range(12)
    )
    w = Workload("t", reqs, duration_s=120.0, block_tokens=bt, closed_loop=False)
    cluster = Cluster(w, GpuProfile.from_json(), None, SimConfig(nodes=3, prefill_nodes=1, seed=0, directory="local"))
    on: dict[str, int] = {}
    done = cluster._finish

    def record(sr, now):
        on[sr.decode_node] = on.get(sr.decode_node, 0) + 1
        done(sr, now)

    # Records the finished requests instead of the cluster's own bookkeeping.
    cluster._finish = record  # type: ignore[method-assign]
    cluster.run()
    assert sorted(on.values()) == [6, 6]
