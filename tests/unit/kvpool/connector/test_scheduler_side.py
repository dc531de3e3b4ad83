"""kvpool.connector.pool's scheduler side: which host slots a load uses, on a full store."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvpool.connector.pool import _SchedulerSide
from kvpool.hashing import block_hashes

BS = 4


@dataclass
class _Request:
    request_id: str
    prompt_token_ids: list[int]
    kv_transfer_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Blocks:
    ids: list[int]

    def get_block_ids(self) -> tuple[list[int]]:
        return (self.ids,)


PROMPT = list(range(100, 100 + 3 * BS))
HASHES = block_hashes(PROMPT, BS, "t")


def _request() -> _Request:
    """The prompt's blocks 0 and 1 offered by peer "p" (slots 5 and 6)."""
    load = [{"block_hash": HASHES[i], "node_id": "p", "slot": 5 + i} for i in range(2)]
    return _Request("r", PROMPT, {"salt": "t", "load": load})


def _commit(side: _SchedulerSide, block_hash: str) -> int:
    """`block_hash` saved in this node's store; its slot."""
    (slot,), _ = side.index.reserve(1)
    side.index.commit(block_hash, slot)
    return slot


def _side(capacity: int) -> _SchedulerSide:
    return _SchedulerSide(SimpleNamespace(block_size=BS, capacity=capacity, events_socket=None))  # type: ignore[arg-type]


def test_a_load_never_stages_a_remote_block_in_a_slot_it_reads_locally() -> None:
    # A full store of 2 slots: block 0 of the prompt is here (the newest),
    # another block is older. The load reads block 0 locally and pulls
    # block 1 from a peer: the staging slot must not be block 0's slot
    # (evicting it would copy block 1's KV into block 0's place too).
    side = _side(capacity=2)
    other = block_hashes(list(range(900, 900 + BS)), BS, "t")[0]
    older, own = _commit(side, other), _commit(side, HASHES[0])
    # The older block is pinned by another load in flight: only block 0's slot is unpinned.
    side.index.pin([older])
    req = _request()
    # No slot can be freed without block 0's: vLLM is told of block 0 only.
    tokens, is_async = side.matched(req, 0)
    assert (tokens, is_async) == (BS, True)
    side.after_alloc(req, _Blocks([10, 11, 12]), tokens)
    (item,) = side.take_plan().loads
    assert item.local_slots == (own,) and item.remote == () and item.device_blocks == (10,)
    assert item.unloaded == () and side.index.lookup(HASHES[0]) == own


def test_blocks_promised_but_not_stageable_at_allocation_are_reported_unloaded() -> None:
    side = _side(capacity=2)
    own = _commit(side, HASHES[0])
    req = _request()
    tokens, _ = side.matched(req, 0)
    assert tokens == 2 * BS  # one free slot to stage block 1 in
    side.index.reserve(1)  # ... taken before the allocation (another request's save)
    side.after_alloc(req, _Blocks([10, 11, 12]), tokens)
    (item,) = side.take_plan().loads
    assert item.local_slots == (own,) and item.device_blocks == (10,) and item.unloaded == (11,)


def test_a_load_stages_remote_blocks_in_free_slots_and_pins_what_it_reads() -> None:
    side = _side(capacity=4)
    own = _commit(side, HASHES[0])
    req = _request()
    tokens, _ = side.matched(req, 0)
    side.after_alloc(req, _Blocks([10, 11, 12]), tokens)
    (item,) = side.take_plan().loads
    (read,) = item.remote
    assert item.local_slots == (own, read.local_slot) and read.local_slot != own
    assert (read.node_id, read.remote_slot) == ("p", 6)
    # Both slots stay pinned until the load ends: a save cannot take them.
    slots, dropped = side.index.reserve(4)
    assert own not in slots and read.local_slot not in slots and dropped == []
