"""Perturbed workloads (`sim.perturb`): literal small workloads in, exact changes out."""

from __future__ import annotations

import pytest

from sim.perturb import FANOUT, GROW_TOKENS, fan_out, flip_loop, grow_contexts, load_factor, perturb, scale_outputs
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


def test_contexts_grow_per_turn_with_new_blocks_at_the_end() -> None:
    base, wl = _branch(), grow_contexts(_branch())
    for k, (a, b) in enumerate(zip(base.requests, wl.requests, strict=True)):
        assert b.prompt_tokens == a.prompt_tokens + k * GROW_TOKENS
        assert b.block_hashes[: len(a.block_hashes)] == a.block_hashes  # the trace's prefix reuse is kept
        assert len(b.block_hashes) - len(a.block_hashes) == k * GROW_TOKENS // 512
    added = [h for b in wl.requests for h in b.block_hashes if h >= 1 << 62]
    assert len(added) == len(set(added))  # a new block appears at one prefix only


def test_fan_out_forks_sub_agents_and_the_next_turn_joins_them() -> None:
    wl = fan_out(_branch(), seed=0)
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
    assert perturb(_branch(), "overload_3x", 0) == _branch() and load_factor("overload_3x", 1.6) == pytest.approx(1.875)
    with pytest.raises(ValueError, match="unknown perturbation"):
        perturb(_branch(), "nope", 0)
