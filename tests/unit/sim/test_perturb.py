"""Perturbed workloads (`sim.perturb`): literal small workloads in, exact changes out."""

from __future__ import annotations

import pytest

from sim.perturb import (
    FANOUT,
    GROW_TOKENS,
    fan_out,
    flip_loop,
    grow_contexts,
    load_factor,
    perturb,
    scale_outputs,
    turns,
)
from sim.workloads import Request, Workload


def _branch(n: int = 8) -> Workload:
    """One closed-loop branch of `n` turns; turn k has k + 1 blocks of 512 tokens (append-only)."""
    reqs = tuple(
        Request(
            req_id=k,
            session_id="s",
            branch_id="b",
            arrival_s=10.0 * k,
            prompt_tokens=512 * (k + 1),
            output_tokens=100 + k,
            block_hashes=tuple(range(k + 1)),
            after=(k - 1,) if k else (),
            gap_s=1.0,
        )
        for k in range(n)
    )
    return Workload("t", reqs, 100.0)


def test_outputs_scale_and_never_reach_zero() -> None:
    wl = scale_outputs(_branch(), 0.5)
    assert [r.output_tokens for r in wl.requests][:3] == [50, 50, 51] and "outputs x0.5" in wl.notes
    assert min(r.output_tokens for r in scale_outputs(_branch(), 0.001).requests) == 1


def _sessionless(*blocks: tuple[int, ...]) -> Workload:
    """Open loop, one request per branch (as a trace without sessions loads): request i has `blocks[i]`."""
    reqs = tuple(
        Request(i, f"r{i}", f"r{i}", float(i), 512 * len(h), 50, h, last_in_branch=True) for i, h in enumerate(blocks)
    )
    return Workload("m", reqs, 10.0, closed_loop=False)


def test_a_sessionless_request_continues_the_prompt_it_carries_all_but_the_last_block_of() -> None:
    wl = _sessionless(
        (0, 1, 2),  # turn 0 of a conversation; block 2 is partial
        (0, 1, 7, 8),  # carries 0, 1 (all but the partial last block): turn 1 of r0's chain
        (0, 9),  # shares only block 0, r0's: a new chain (and its stem (0,) is r0's content, not its own)
        (0, 1, 7, 10, 11),  # continues r1 (0, 1, 7): turn 2
        (0, 1),  # as long as r0's stem: not longer; r2's stem (0,) is not r2's own: a new chain
        (5,),  # one block: continues nothing, and nothing continues it
    )
    assert turns(wl) == {0: ("r0", 0), 1: ("r0", 1), 2: ("r2", 0), 3: ("r0", 2), 4: ("r4", 0), 5: ("r5", 0)}
    grown = grow_contexts(wl)
    assert grown is not None
    assert [r.prompt_tokens - a.prompt_tokens for r, a in zip(grown.requests, wl.requests, strict=True)] == [
        0,
        GROW_TOKENS,
        0,
        2 * GROW_TOKENS,
        0,
        0,
    ]


def test_a_shared_prefix_alone_is_not_a_continuation() -> None:
    # r1 repeats r0's stem (0, 1) without content of its own: it continues r0, and r2 continues r0 too
    # (not r1, which carried no block first); r3's stem (9,) was first carried by r3, so r4 continues r3.
    wl = _sessionless((0, 1, 2), (0, 1, 5), (0, 1, 7, 8), (9, 3), (9, 4, 6))
    assert turns(wl) == {0: ("r0", 0), 1: ("r0", 1), 2: ("r0", 1), 3: ("r3", 0), 4: ("r3", 1)}


def test_sessionless_chains_fan_out_and_traces_without_blocks_have_no_form() -> None:
    chain = _sessionless(*(tuple(range(k + 2)) for k in range(8)))  # each request extends the last by one block
    assert [t for _, t in turns(chain).values()] == list(range(8))
    wl = fan_out(chain, seed=0)
    assert wl is not None
    subs = [r for r in wl.requests if r.parent_branch_id is not None]
    assert len(subs) == 2 * FANOUT and {r.parent_branch_id for r in subs} == {"r3", "r7"}
    assert all(not r.after for r in wl.requests)  # open loop: no joins
    flat = _sessionless((), (), ())  # Azure / ServeGen: no block ids
    assert grow_contexts(flat) is None and fan_out(flat, 0) is None
    assert perturb(flat, "contexts_grow", 0) is None and perturb(flat, "fanout", 0) is None


def test_contexts_grow_per_turn_with_new_blocks_at_the_end() -> None:
    base, wl = _branch(), grow_contexts(_branch())
    assert wl is not None
    for k, (a, b) in enumerate(zip(base.requests, wl.requests, strict=True)):
        assert b.prompt_tokens == a.prompt_tokens + k * GROW_TOKENS
        assert b.block_hashes[: len(a.block_hashes)] == a.block_hashes  # the trace's prefix reuse is kept
        assert len(b.block_hashes) - len(a.block_hashes) == k * GROW_TOKENS // 512
    added = [h for b in wl.requests for h in b.block_hashes if h >= 1 << 62]
    assert len(added) == len(set(added))  # a new block appears at one prefix only


def test_fan_out_forks_sub_agents_and_the_next_turn_joins_them() -> None:
    wl = fan_out(_branch(), seed=0)
    assert wl is not None
    subs = [r for r in wl.requests if r.parent_branch_id == "b"]
    assert len(subs) == 2 * FANOUT  # turns 3 and 7 fork
    fork = next(r for r in _branch().requests if r.req_id == 3)
    first = [r for r in subs if r.after == fork.after]
    assert len(first) == FANOUT and all(r.block_hashes[:4] == fork.block_hashes for r in first)
    join = next(r for r in wl.requests if r.req_id == 4)
    assert set(join.after) == {3, *(r.req_id for r in first)}
    assert [r.arrival_s for r in wl.requests] == sorted(r.arrival_s for r in wl.requests)


def test_loop_flip_and_its_missing_form() -> None:
    flipped = flip_loop(_branch())
    assert flipped is not None and flipped.closed_loop is False
    opened = Workload("o", (), 10.0, closed_loop=False)
    assert flip_loop(opened) is None
    # No turn depends on another (a trace without sessions, loaded "closed"): both loops replay it alike.
    assert flip_loop(_sessionless((0, 1), (2, 3))) is None
    assert perturb(_branch(), "overload_3x", 0) == _branch() and load_factor("overload_3x", 1.6) == pytest.approx(1.875)
    with pytest.raises(ValueError, match="unknown perturbation"):
        perturb(_branch(), "nope", 0)
