"""The contract every `kvpool.directory.BlockDirectory` backend passes
(memory in the unit tests, Redis in the integration tests): subclass
`DirectoryContract` and provide a `directory` fixture."""

from __future__ import annotations

import pytest

from kvpool.directory import BlockDirectory, BranchState, BranchStateError, Location

H = [f"{i:032x}" for i in range(1, 21)]  # h1..h20 as 32-hex strings
BB = 1024


class DirectoryContract:
    """Exact values through every operation; `directory` is a fresh, empty one."""

    # -- locations and prefix lookup ---------------------------------------
    def test_longest_prefix_across_nodes(self, directory: BlockDirectory) -> None:
        directory.publish("n1", [(H[0], 0), (H[1], 1), (H[2], 2)], BB, now=1.0)
        directory.publish("n2", [(H[0], 5), (H[1], 6), (H[3], 7)], BB, now=1.0)
        hit = directory.longest_prefix([H[0], H[1], H[2], H[3], H[4]])
        assert hit.num_blocks == 4
        assert hit.per_node_blocks == {"n1": 3, "n2": 2}
        # n1 holds the longest contiguous prefix, so it serves blocks 0-2.
        assert hit.locations == [Location("n1", 0), Location("n1", 1), Location("n1", 2), Location("n2", 7)]
        assert hit.holders[0] == {"n1": 0, "n2": 5}
        assert directory.longest_prefix([H[0], H[1]], prefer="n2").locations == [Location("n2", 5), Location("n2", 6)]
        assert directory.longest_prefix([H[0], H[3]], exclude=["n1"]).num_blocks == 2
        assert directory.longest_prefix([H[2]], exclude=["n1"]).num_blocks == 0
        assert directory.longest_prefix([H[9], H[0]]).num_blocks == 0
        assert directory.longest_prefix([]).num_blocks == 0

    def test_publish_moves_slot_and_unpublish(self, directory: BlockDirectory) -> None:
        directory.publish("n1", [(H[0], 0)], BB, now=1.0)
        directory.publish("n1", [(H[0], 3)], BB, now=2.0)
        assert directory.longest_prefix([H[0]]).locations == [Location("n1", 3)]
        directory.unpublish("n1", [H[0], H[5]])
        assert directory.longest_prefix([H[0]]).num_blocks == 0
        assert directory.stats().blocks == 0

    def test_drop_node(self, directory: BlockDirectory) -> None:
        directory.publish("n1", [(H[0], 0), (H[1], 1)], BB, now=1.0)
        directory.publish("n2", [(H[0], 0)], BB, now=1.0)
        assert directory.drop_node("n1") == sorted([H[0], H[1]])
        assert directory.longest_prefix([H[0], H[1]]).per_node_blocks == {"n2": 1}
        assert directory.stats().blocks == 1 and directory.stats().bytes == BB

    # -- branches and reference counts --------------------------------------
    def test_exact_ref_counts_through_lifecycle(self, directory: BlockDirectory) -> None:
        info = directory.open_branch("b1", "t1", now=10.0)
        assert (info.state, info.opened_at, info.num_blocks) == (BranchState.ACTIVE, 10.0, 0)
        directory.open_branch("b2", "t1", now=11.0, parent_id="b1", session_id="s1")
        assert directory.reference("b1", [H[0], H[1], H[0]], now=12.0) == 2  # twice counts once
        assert directory.reference("b1", [H[1], H[2]], now=13.0) == 1
        assert directory.reference("b2", [H[0], H[3]], now=14.0) == 2
        assert directory.ref_counts([H[0], H[1], H[2], H[3], H[4]]) == [2, 1, 1, 1, 0]
        assert directory.branch_blocks("t1") == 4
        b2 = directory.branch("b2")
        assert b2 is not None and (b2.parent_id, b2.session_id, b2.num_blocks) == ("b1", "s1", 2)

        done = directory.finish_branch("b1")
        assert done is not None and done.state is BranchState.FINISHED and done.num_blocks == 3
        assert directory.ref_counts([H[0], H[1], H[2], H[3]]) == [1, 0, 0, 1]
        assert directory.finish_branch("b1") is None  # idempotent
        assert directory.branch("b1") is None
        with pytest.raises(BranchStateError):
            directory.reference("b1", [H[0]], now=15.0)
        with pytest.raises(BranchStateError):
            directory.touch("b1", now=15.0)

        assert directory.expire(now=100.0, idle_ttl_s=86.0) == ["b2"]  # idle exactly ttl
        assert directory.ref_counts([H[0], H[3]]) == [0, 0]
        assert directory.branch_blocks("t1") == 0
        assert directory.stats().referenced_blocks == 0 and directory.stats().active_branches == 0

    def test_reopen_after_finish_starts_fresh(self, directory: BlockDirectory) -> None:
        directory.open_branch("b", "t", now=1.0)
        directory.reference("b", [H[0]], now=1.0)
        directory.finish_branch("b")
        info = directory.open_branch("b", "t", now=5.0)
        assert (info.opened_at, info.num_blocks) == (5.0, 0)
        assert directory.ref_counts([H[0]]) == [0]

    def test_touch_and_reference_postpone_expiry(self, directory: BlockDirectory) -> None:
        directory.open_branch("a", "t", now=0.0)
        directory.open_branch("b", "t", now=0.0)
        directory.open_branch("c", "t", now=0.0)
        directory.touch("a", now=50.0)
        directory.reference("b", [H[0]], now=60.0)
        directory.open_branch("c", "t", now=40.0)  # open again = touch
        directory.touch("a", now=20.0)  # older time never moves it back
        assert directory.expire(now=100.0, idle_ttl_s=45.0) == ["a", "c"]
        b = directory.branch("b")
        assert b is not None and b.last_active_at == 60.0
        assert directory.expire(now=100.0, idle_ttl_s=45.0) == []

    def test_tenant_blocks_and_top_branches(self, directory: BlockDirectory) -> None:
        directory.open_branch("x1", "tx", now=1.0)
        directory.open_branch("x2", "tx", now=1.0)
        directory.open_branch("y1", "ty", now=1.0)
        directory.reference("x1", [H[0], H[1]], now=1.0)
        directory.reference("x2", [H[1], H[2], H[3]], now=1.0)
        directory.reference("y1", [H[0], H[4]], now=1.0)
        assert directory.branch_blocks("tx") == 4 and directory.branch_blocks("ty") == 2
        assert directory.branch_blocks("nobody") == 0
        top = directory.top_branches(2)
        assert [(b.branch_id, b.num_blocks, b.tenant_id) for b in top] == [("x2", 3, "tx"), ("x1", 2, "tx")]
        assert [b.branch_id for b in directory.top_branches(10)] == ["x2", "x1", "y1"]

    # -- eviction ----------------------------------------------------------
    def test_eviction_unreferenced_lru_first_referenced_last(self, directory: BlockDirectory) -> None:
        directory.publish("n1", [(H[0], 0), (H[1], 1), (H[2], 2), (H[3], 3)], BB, now=1.0)
        directory.touch_blocks("n1", [H[0]], now=5.0)
        directory.touch_blocks("n1", [H[2]], now=3.0)
        directory.touch_blocks("n1", [H[9]], now=9.0)  # not held: ignored
        directory.open_branch("b", "t", now=1.0)
        directory.reference("b", [H[1], H[0]], now=1.0)
        # unreferenced: H3 (t=1) then H2 (t=3); referenced: H1 (t=1) then H0 (t=5)
        assert directory.choose_victims("n1", 10) == [H[3], H[2], H[1], H[0]]
        assert directory.choose_victims("n1", 1) == [H[3]]
        assert directory.choose_victims("n2", 3) == []
        assert directory.eviction_order("n1", [H[0], H[2], H[7]]) == [H[7], H[2], H[0]]
        directory.finish_branch("b")
        assert directory.choose_victims("n1", 10) == [H[1], H[3], H[2], H[0]]

    # -- stats ---------------------------------------------------------------
    def test_stats_and_hit_rate(self, directory: BlockDirectory) -> None:
        directory.publish("n1", [(H[0], 0), (H[1], 1)], BB, now=1.0)
        directory.publish("n2", [(H[0], 0)], 2 * BB, now=1.0)
        directory.longest_prefix([H[0], H[1], H[2], H[3]])  # 2 of 4
        directory.longest_prefix([H[5], H[6]])  # 0 of 2
        directory.longest_prefix([H[0]], record=False)
        directory.open_branch("b", "t", now=1.0)
        directory.reference("b", [H[0], H[7]], now=1.0)
        st = directory.stats()
        assert (st.blocks, st.bytes, st.referenced_blocks, st.active_branches) == (2, 4 * BB, 2, 1)
        assert (st.lookups, st.looked_up_blocks, st.hit_blocks) == (2, 6, 2)
        assert st.hit_rate == pytest.approx(2 / 6)
