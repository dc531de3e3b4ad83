"""Agent workload generators with branch structure (pure, seeded).

Every generator returns a `Workload`: a tuple of `Request` records sorted by
`arrival_s`, shared by the simulator and the live replay client.

Closed-loop contract: a request whose `after` is non-empty arrives
`gap_s` seconds after the *last* of those requests finishes (a tool call runs
between turns; a parent resumes when its sub-agents are done). Its
`arrival_s` is the nominal time assuming `NOMINAL_S_PER_OUTPUT_TOKEN` of
service per output token; open-loop replays use `arrival_s` for every request.

Prefix structure: `block_hashes` lists the ids of the prompt's full blocks of
`block_tokens` tokens. Contexts grow append-only, so block i of a branch keeps
its id from turn to turn; blocks inside a shared system prompt have ids shared
by every agent of that kind; a sub-agent shares its parent's blocks up to the
fork. Ids are opaque ints (like Mooncake's `hash_ids`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

NOMINAL_S_PER_OUTPUT_TOKEN = 0.02
BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Request:
    req_id: int
    session_id: str
    branch_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()
    parent_branch_id: str | None = None
    after: tuple[int, ...] = ()  # req_ids whose completion releases this turn
    gap_s: float = 0.0  # tool time after the last of `after` finishes
    last_in_branch: bool = True
    kind: str = ""  # workload class: coding | math | cu | trace ...


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[Request, ...]
    duration_s: float
    block_tokens: int = BLOCK_TOKENS
    closed_loop: bool = True
    notes: tuple[str, ...] = ()  # what a loader or replay left out or changed, for the report

    def by_id(self) -> dict[int, Request]:
        return {r.req_id: r for r in self.requests}


@dataclass(frozen=True)
class AgentShape:
    """Distribution of one kind of agent. Ranges are inclusive uniform (lo, hi)."""

    kind: str
    system_tokens: int  # shared system prompt (same blocks for every agent of the kind)
    first_tokens: tuple[int, int]  # the task description
    turns: tuple[int, int]
    append_tokens: tuple[int, int]  # tool output / screenshot appended per turn
    output_tokens: tuple[int, int]
    tool_gap_s: tuple[float, float]
    max_context: int = 120_000  # an agent stops (compacts) before this


CODING = AgentShape("coding", 6_000, (800, 3_000), (10, 40), (300, 3_000), (80, 600), (1.0, 8.0))
# Math/reasoning: short prompts (300-1,000 tokens: 200 shared + 100-800 task),
# 1-3 turns with small tool results, long reasoning outputs of 2-8k tokens.
MATH = AgentShape("math", 200, (100, 800), (1, 3), (100, 400), (2_000, 8_000), (0.5, 3.0))
# Computer use: many turns, each appending a screenshot-sized observation of
# 1-3k tokens to a growing context, short actions of 50-200 tokens.
COMPUTER_USE = AgentShape("cu", 3_000, (200, 800), (15, 45), (1_000, 3_000), (50, 200), (1.0, 4.0))
SHAPES = {s.kind: s for s in (CODING, MATH, COMPUTER_USE)}


class _Ids:
    """Deterministic id source shared by all agents of one workload."""

    def __init__(self) -> None:
        self.req = itertools.count()
        self.block = itertools.count(1 << 20)  # below: shared system-prompt blocks
        self.branch = itertools.count()

    def system_blocks(self, shape: AgentShape, block_tokens: int) -> list[int]:
        base = (1 + list(SHAPES).index(shape.kind) if shape.kind in SHAPES else 9) * 10_000
        return [base + i for i in range(shape.system_tokens // block_tokens)]


def _u(rng: np.random.Generator, lo_hi: tuple[int, int]) -> int:
    lo, hi = lo_hi
    return int(rng.integers(lo, hi + 1))


def _uf(rng: np.random.Generator, lo_hi: tuple[float, float]) -> float:
    lo, hi = lo_hi
    return float(rng.uniform(lo, hi))


def _extend(blocks: list[int], tokens: int, block_tokens: int, ids: _Ids) -> list[int]:
    """Fresh block ids up to `tokens` (in place: each branch owns its list)."""
    blocks.extend(itertools.islice(ids.block, max(0, tokens // block_tokens - len(blocks))))
    return blocks


def _branch(
    rng: np.random.Generator,
    shape: AgentShape,
    ids: _Ids,
    *,
    session: str,
    start_s: float,
    after: tuple[int, ...],
    gap_s: float,
    block_tokens: int,
    prefix: tuple[list[int], int] | None = None,
    parent: str | None = None,
    turns: int | None = None,
) -> list[Request]:
    """One agent branch: turns that each append tool output to a growing context."""
    branch = f"{session}/b{next(ids.branch)}"
    if prefix is None:
        blocks, context = ids.system_blocks(shape, block_tokens), shape.system_tokens
    else:
        blocks, context = list(prefix[0]), prefix[1]
    context += _u(rng, shape.first_tokens)
    n_turns = turns if turns is not None else _u(rng, shape.turns)
    out: list[Request] = []
    t = start_s
    for k in range(n_turns):
        if k:
            context += out[-1].output_tokens + _u(rng, shape.append_tokens)
        if context >= shape.max_context:
            break
        blocks = _extend(blocks, context, block_tokens, ids)
        o = _u(rng, shape.output_tokens)
        dep = after if k == 0 else (out[-1].req_id,)
        g = gap_s if k == 0 else _uf(rng, shape.tool_gap_s)
        t = t + g
        out.append(
            Request(next(ids.req), session, branch, t, context, o, tuple(blocks), parent, dep, g, False, shape.kind)
        )
        t += o * NOMINAL_S_PER_OUTPUT_TOKEN
    if out:
        out[-1] = _replace_last(out[-1])
    return out


def _replace_last(r: Request) -> Request:
    return Request(
        r.req_id,
        r.session_id,
        r.branch_id,
        r.arrival_s,
        r.prompt_tokens,
        r.output_tokens,
        r.block_hashes,
        r.parent_branch_id,
        r.after,
        r.gap_s,
        True,
        r.kind,
    )


def _end_s(reqs: list[Request]) -> float:
    return max(r.arrival_s + r.output_tokens * NOMINAL_S_PER_OUTPUT_TOKEN for r in reqs)


MixFn = Callable[[float], dict[str, float]]  # nominal time -> {kind: weight}


def agents(
    mix: MixFn,
    *,
    duration_s: float,
    seed: int,
    concurrency: int | None = None,
    agents_per_min: float | None = None,
    name: str = "agents",
    block_tokens: int = BLOCK_TOKENS,
    shapes: dict[str, AgentShape] | None = None,
) -> Workload:
    """Agents whose kind follows `mix(t)`.

    Exactly one of: `concurrency` (closed loop: that many agent slots, a slot
    starts its next agent 1 s after the previous one's last turn) or
    `agents_per_min` (open-loop Poisson agent arrivals; turns inside an agent
    stay closed-loop).
    """
    if (concurrency is None) == (agents_per_min is None):
        raise ValueError("give exactly one of concurrency, agents_per_min")
    shapes = shapes or SHAPES
    rng = np.random.default_rng(seed)
    ids = _Ids()
    reqs: list[Request] = []

    def pick(t: float) -> AgentShape:
        w = mix(t)
        kinds = sorted(w)
        p = np.array([w[k] for k in kinds], dtype=float)
        return shapes[kinds[int(rng.choice(len(kinds), p=p / p.sum()))]]

    if concurrency is not None:
        for slot in range(concurrency):
            after: tuple[int, ...] = ()
            t, n = float(rng.uniform(0, 30.0)), 0
            while t < duration_s:
                br = _branch(
                    rng,
                    pick(t),
                    ids,
                    session=f"s{slot}.{n}",
                    start_s=t,
                    after=after,
                    gap_s=0.0 if not after else 1.0,
                    block_tokens=block_tokens,
                )
                if not br:
                    continue
                reqs += br
                t, after, n = _end_s(br) + 1.0, (br[-1].req_id,), n + 1
    else:
        assert agents_per_min is not None
        t, n = 0.0, 0
        while True:
            t += float(rng.exponential(60.0 / agents_per_min))
            if t >= duration_s:
                break
            reqs += _branch(
                rng, pick(t), ids, session=f"a{n}", start_s=t, after=(), gap_s=0.0, block_tokens=block_tokens
            )
            n += 1
    reqs.sort(key=operator.attrgetter("arrival_s", "req_id"))
    return Workload(name, tuple(reqs), duration_s, block_tokens, closed_loop=True)


def subagent_burst(
    *,
    seed: int,
    duration_s: float = 3_600.0,
    background: int = 48,
    burst_at_s: float = 1_200.0,
    fanout: int = 64,
    block_tokens: int = BLOCK_TOKENS,
) -> Workload:
    """Steady coding agents plus one parent that forks `fanout` sub-agents at
    once (sharing its prefix) and resumes when all are done: a short burst
    with no sustained change in the workload."""
    base = agents(
        lambda t: {"coding": 1.0}, duration_s=duration_s, seed=seed, concurrency=background, block_tokens=block_tokens
    )
    rng = np.random.default_rng(seed + 1)
    ids = _Ids()
    ids.req = itertools.count(max(r.req_id for r in base.requests) + 1)
    ids.block = itertools.count(1 << 40)
    parent = _branch(
        rng,
        CODING,
        ids,
        session="burst",
        start_s=burst_at_s - 30.0,
        after=(),
        gap_s=0.0,
        block_tokens=block_tokens,
        turns=3,
    )
    head = parent[-1]
    children: list[Request] = []
    for _ in range(fanout):
        children += _branch(
            rng,
            CODING,
            ids,
            session="burst",
            start_s=head.arrival_s + 1.0,
            after=(head.req_id,),
            gap_s=1.0,
            block_tokens=block_tokens,
            prefix=(list(head.block_hashes), head.prompt_tokens + head.output_tokens),
            parent=head.branch_id,
            turns=int(rng.integers(2, 5)),
        )
    lasts = tuple(r.req_id for r in children if r.last_in_branch)
    resume = _branch(
        rng,
        CODING,
        ids,
        session="burst",
        start_s=_end_s(children) + 1.0,
        after=lasts,
        gap_s=1.0,
        block_tokens=block_tokens,
        turns=3,
        prefix=(list(head.block_hashes), head.prompt_tokens + head.output_tokens),
    )
    reqs = sorted(base.requests + tuple(parent + children + resume), key=lambda r: (r.arrival_s, r.req_id))
    return Workload("burst", tuple(reqs), duration_s, block_tokens)


def shift_mix(duration_s: float) -> MixFn:
    """Math-dominated first third, a linear move, computer-use last third."""

    def mix(t: float) -> dict[str, float]:
        x = min(1.0, max(0.0, (t / duration_s - 1 / 3) * 3))
        cu = 0.05 + 0.9 * x
        return {"math": 1.0 - cu, "cu": cu}

    return mix


def shift(*, seed: int, duration_s: float = 10_800.0, concurrency: int = 160) -> Workload:
    """The study's 3-hour run moving from math to computer-use agents."""
    return agents(shift_mix(duration_s), duration_s=duration_s, seed=seed, concurrency=concurrency, name="shift")


def constant(kind: str, **kw: Any) -> Workload:
    return agents(lambda t: {kind: 1.0}, name=kind, **kw)


__all__ = [
    "AgentShape",
    "CODING",
    "COMPUTER_USE",
    "MATH",
    "Request",
    "Workload",
    "agents",
    "constant",
    "shift",
    "shift_mix",
    "subagent_burst",
]
