"""kvpool.plan: `step_shape` from a fake SchedulerOutput, the `SlotIndex` slot lifecycle
(exact slots and dropped pairs), and `plan_prefix_sources` over literal offers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvpool.plan import SlotIndex, plan_prefix_sources, step_shape


def _fake_scheduler_output() -> SimpleNamespace:
    """Fake with the fields step_shape reads: a new prompt (300 scheduled over
    200 cached), a prompt's second chunk (100 over 512 computed), a decode
    (1 token over 40 computed)."""
    new = [SimpleNamespace(req_id="a", num_computed_tokens=200)]
    cached = SimpleNamespace(req_ids=["b", "c"], num_output_tokens=[0, 3], num_computed_tokens=[512, 40])
    return SimpleNamespace(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens={"a": 300, "b": 100, "c": 1}
    )


def test_step_shape_sums_prefills_and_decodes_and_per_prompt_attention_pairs() -> None:
    assert step_shape(_fake_scheduler_output()) == {
        "prefill_requests": 2,
        "uncached_prompt_tokens": 400,
        "cached_prompt_tokens": 200,
        "attention_pairs": 300 * (300 + 200) + 100 * (100 + 512),
        "decode_requests": 1,
        "generated_tokens": 1,
        "context_tokens": 41,
    }


def _index(capacity: int, *hashes: str) -> SlotIndex:
    """An index whose first len(hashes) slots hold `hashes`, committed in order (LRU first)."""
    index = SlotIndex(capacity)
    slots, dropped = index.reserve(len(hashes))
    assert dropped == []
    for h, s in zip(hashes, slots, strict=True):
        index.commit(h, s)
    return index


def test_slot_index_rejects_an_empty_store() -> None:
    with pytest.raises(ValueError, match="capacity must be > 0"):
        SlotIndex(0)


def test_fresh_index_hands_out_slots_from_zero() -> None:
    index = SlotIndex(3)
    assert index.reserve(2) == ([0, 1], [])
    assert index.reserve(1) == ([2], [])
    assert len(index) == 0


def test_commit_then_lookup() -> None:
    index = _index(3, "a", "b")
    assert (index.lookup("a"), index.lookup("b"), index.lookup("z")) == (0, 1, None)
    assert len(index) == 2


def test_reserve_evicts_least_recently_used_first() -> None:
    index = _index(3, "a", "b", "c")
    assert index.reserve(2) == ([0, 1], [("a", 0), ("b", 1)])
    assert (index.lookup("a"), index.lookup("c"), len(index)) == (None, 2, 1)


def test_lookup_refreshes_lru_order() -> None:
    index = _index(3, "a", "b", "c")
    assert index.lookup("a") == 0
    assert index.reserve(2) == ([1, 2], [("b", 1), ("c", 2)])


def test_pinned_slots_are_never_evicted() -> None:
    index = _index(3, "a", "b", "c")
    index.pin([0, 2])
    assert index.reserve(3) == ([1], [("b", 1)])
    assert (index.lookup("a"), index.lookup("c")) == (0, 2)


def test_pins_count_until_each_is_unpinned() -> None:
    index = _index(2, "a", "b")
    index.pin([0])
    index.pin([0])
    index.unpin([0])
    assert index.reserve(2) == ([1], [("b", 1)])
    index.unpin([0])
    assert index.reserve(1) == ([0], [("a", 0)])


def test_unpin_of_an_unpinned_slot_is_harmless() -> None:
    index = _index(1, "a")
    index.unpin([0])
    assert index.reserve(1) == ([0], [("a", 0)])


def test_reserved_slots_are_not_handed_out_twice() -> None:
    index = SlotIndex(2)
    assert index.reserve(2) == ([0, 1], [])
    assert index.reserve(1) == ([], [])


def test_release_returns_a_reserved_slot_to_the_free_list() -> None:
    index = SlotIndex(2)
    assert index.reserve(2) == ([0, 1], [])
    index.release(1)
    assert index.reserve(1) == ([1], [])


def test_release_ignores_a_committed_slot() -> None:
    index = _index(1, "a")
    index.release(0)
    assert index.lookup("a") == 0
    assert index.reserve(1) == ([0], [("a", 0)])  # still a block to evict, not a free slot


def test_committing_a_known_hash_to_a_new_slot_frees_the_old_one() -> None:
    index = _index(2, "a")
    assert index.reserve(1) == ([1], [])
    index.commit("a", 1)
    assert (index.lookup("a"), len(index)) == (1, 1)
    assert index.reserve(1) == ([0], [])


def test_recommitting_the_same_slot_keeps_it_out_of_the_free_list() -> None:
    index = _index(1, "a")
    index.commit("a", 0)
    assert index.reserve(1) == ([0], [("a", 0)])


def test_a_pinned_older_copy_is_not_handed_out_after_a_recommit() -> None:
    index = _index(2, "a")
    index.pin([0])  # a local load reads block "a" from slot 0
    assert index.reserve(1) == ([1], [])  # a second save of the same block
    index.commit("a", 1)
    slots, _ = index.reserve(1)
    assert 0 not in slots


H = ["h0", "h1", "h2", "h3"]  # slots 0 and 1 hold h0 and h1 locally
OFFERS = {2: ("h2", "n7", 5), 3: ("h3", "n8", 6)}
L0, L1, R2, R3 = (0, "h0", None, 0), (1, "h1", None, 1), (2, "h2", "n7", 5), (3, "h3", "n8", 6)


@pytest.mark.parametrize(
    ("start", "max_blocks", "remote", "expected"),
    [
        (0, 4, {}, [L0, L1]),  # local hits, then nothing for h2: the walk stops
        (0, 4, OFFERS, [L0, L1, R2, R3]),  # remote offers continue the prefix
        (0, 4, {2: ("hX", "n7", 5), 3: ("h3", "n8", 6)}, [L0, L1]),  # another hash offered: stop
        (0, 3, OFFERS, [L0, L1, R2]),  # max_blocks: the exclusive end index
        (0, 9, OFFERS, [L0, L1, R2, R3]),  # ... capped by the prompt's blocks
        (1, 4, OFFERS, [L1, R2, R3]),  # start past the computed blocks
        (2, 2, OFFERS, []),
        (0, 1, {0: ("h0", "n7", 9)}, [L0]),  # a local copy wins over an offer
    ],
)
def test_plan_prefix_sources(
    start: int,
    max_blocks: int,
    remote: dict[int, tuple[str, str, int]],
    expected: list[tuple[int, str, str | None, int]],
) -> None:
    assert plan_prefix_sources(H, start, max_blocks, _index(4, "h0", "h1"), remote) == expected


def test_plan_prefix_sources_needs_a_contiguous_prefix() -> None:
    index = _index(4, "h1")
    assert plan_prefix_sources(H, 0, 4, index, {}) == []


def test_a_quarantined_staging_slot_stays_out_of_use_after_release() -> None:
    index = SlotIndex(3)
    staging, _ = index.reserve(2)
    assert staging == [0, 1]
    index.quarantine([0])
    index.release(0)
    index.release(1)
    assert index.reserve(3) == ([1, 2], [])  # 0 is held back
    assert index.quarantined == frozenset({0})
    index.unquarantine([0])
    assert index.quarantined == frozenset()
    assert index.reserve(1) == ([0], [])


def test_unquarantine_before_release_frees_at_release_as_usual() -> None:
    index = SlotIndex(2)
    (slot,), _ = index.reserve(1)
    index.quarantine([slot])
    index.unquarantine([slot])  # the stuck read finished while the request still ran
    assert index.reserve(1) == ([1], [])
    index.release(slot)
    assert index.reserve(1) == ([slot], [])


def test_unquarantine_of_a_slot_never_quarantined_is_harmless() -> None:
    index = SlotIndex(2)
    index.unquarantine([0, 1])
    assert index.reserve(2) == ([0, 1], [])


def test_a_quarantined_retired_copy_is_held_at_its_last_unpin() -> None:
    index = _index(3, "a")
    index.pin([0])  # a load still reads the old copy
    (new,), _ = index.reserve(1)
    index.commit("a", new)
    index.quarantine([0])
    index.unpin([0])
    assert index.reserve(1) == ([2], [])
    assert index.reserve(1) == ([1], [("a", 1)])  # the old copy's slot 0 is still held
    index.unquarantine([0])
    assert index.reserve(1) == ([0], [])


def test_available_counts_free_and_evictable_slots_and_stops_at_enough() -> None:
    idx = SlotIndex(4)
    slots, _ = idx.reserve(3)
    for i, s in enumerate(slots):
        idx.commit(f"h{i}", s)
    idx.pin([slots[0]])
    assert idx.available() == 3  # one free, two unpinned blocks
    assert idx.available(keep=[slots[1]]) == 2
    assert idx.available(enough=1) == 1  # the free slot answers at once
    assert idx.available(keep=[slots[1]], enough=5) == 2
