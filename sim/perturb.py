"""Perturbed copies of a workload: the suite's cases the planner was not tuned on.

Every trace case of `simulate --suite` also runs under each perturbation
(`PERTURBATIONS`), each a pure function of the workload and a seed:

- `output_x0.5`, `output_x2`: every output length halved / doubled (a
  reasoning model vs a terse one on the same agent runs): moves work
  between the phases.
- `contexts_grow`: the k-th turn of a branch carries k x `GROW_TOKENS`
  more context (tool results that accumulate, as SWE-agent trajectories
  do), up to `GROW_MAX_TOKENS`; the added blocks are new to each turn, so
  prefill and decode KV both grow.
- `fanout`: every `FANOUT_EVERY`-th turn of a branch forks `FANOUT`
  sub-agents that share its context, each with its own short tail and the
  same output; in a closed loop the branch's next turn waits for all of
  them (a join), so bursts of parallel requests arrive at once.
- `loop_flip`: a closed loop replayed open (every turn at its trace time,
  whatever the cluster serves) or, for a trace that has sessions but was
  replayed open, closed; a trace without turn dependencies replays alike
  in both loops and is left out (`None`).
- `overload_3x`: the case's load raised to 3x the capacity estimate the
  suite placed it on (`sim.suite_cases`): deep overload.

What a "turn" is (`turns`): in a branch of several requests, its
position in the branch. A trace without sessions (Mooncake, Azure,
ServeGen) makes every request a branch of its own; there a request's
turn comes from its **prefix chain**: it continues the earlier request
whose prompt blocks, all but the last, begin its own prompt, are fewer
than its own, and end in a block that request was the first to carry
whole (before its last); its turn is that request's plus one. The last
block is left out because it is partial: the next turn of a conversation
appends to it (the answer, the next message), so its id changes while
every block before it is carried over whole. The first-to-carry
condition keeps a shared system prompt from chaining strangers: a
request whose blocks but the last were all carried whole before has no
content of its own to be continued (ids name their prefix, so the last
of them being new is enough). A request that continues none starts a
chain at turn 0, and so does every request of a trace without block ids
(Azure, ServeGen): with no prefix, no request can be told to follow
another, and each is a one-turn conversation. A perturbation that
changes no request (no turn past the first, no branch long enough to
fork) has no form for the trace and returns None, like `loop_flip`: the
suite leaves the case out and says so, instead of re-running the base
case under another name.

Block ids keep naming their prefix (the simulator's index relies on it):
new blocks get ids derived from the request and position, never reused
at another prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from sim.replay import copy_block_id
from sim.workloads import Request, Workload

GROW_TOKENS = 2_000  # per turn of a branch: a tool result of a few pages
GROW_MAX_TOKENS = 40_000  # SWE-agent contexts reach tens of thousands of tokens
FANOUT = 3  # sub-agents per fork (an orchestrator's web, file and coder agents)
FANOUT_EVERY = 4  # turns of a branch between forks
OVERLOAD = 3.0  # x the capacity estimate (the suite's own overload level is 1.6)

_NEW = 1 << 62  # ids of added blocks live above every trace id (< 2^62 in the stored traces)


def _new_block(req_id: int, position: int, salt: int) -> int:
    return _NEW | (copy_block_id(req_id * 4096 + position, salt + 1) & (_NEW - 1))


def scale_outputs(wl: Workload, factor: float) -> Workload:
    reqs = tuple(replace(r, output_tokens=max(1, round(r.output_tokens * factor))) for r in wl.requests)
    return replace(wl, requests=reqs, notes=(*wl.notes, f"outputs x{factor:g}"))


def turns(wl: Workload) -> dict[int, tuple[str, int]]:
    """{req_id: (branch, turn from 0)} by the rule of the module doc; a
    session-less request's branch is the id of its chain's first request."""
    size: dict[str, int] = {}
    for r in wl.requests:
        size[r.branch_id] = size.get(r.branch_id, 0) + 1
    out: dict[int, tuple[str, int]] = {}
    seen: dict[str, int] = {}
    stems: dict[int, int] = {}  # id of a stem's last block -> the request that carried it first
    carried: set[int] = set()  # blocks some request carried before its last (whole: the last may be partial)
    for r in wl.requests:  # sorted by arrival
        if size[r.branch_id] > 1:
            k = seen.get(r.branch_id, 0)
            seen[r.branch_id] = k + 1
            out[r.req_id] = (r.branch_id, k)
            continue
        h = r.block_hashes
        # Ids name their prefix, so h[i] equal to a stem's last id means h[: i + 1] is that stem.
        parent = next((stems[h[i]] for i in range(len(h) - 2, -1, -1) if h[i] in stems), None)
        out[r.req_id] = (out[parent][0], out[parent][1] + 1) if parent is not None else (r.branch_id, 0)
        if len(h) >= 2 and h[-2] not in carried:
            stems[h[-2]] = r.req_id
        carried.update(h[:-1])
    return out


def grow_contexts(wl: Workload) -> Workload | None:
    """The k-th turn of each branch (k from 0, `turns`) gets k x GROW_TOKENS
    more prompt, capped; None when no request is past its first turn."""
    turn = turns(wl)
    out: list[Request] = []
    bt = wl.block_tokens
    grown = 0
    for r in wl.requests:
        extra = min(turn[r.req_id][1] * GROW_TOKENS, GROW_MAX_TOKENS)
        if extra == 0:
            out.append(r)
            continue
        grown += 1
        blocks = tuple(_new_block(r.req_id, j, 1) for j in range(extra // bt))
        out.append(replace(r, prompt_tokens=r.prompt_tokens + extra, block_hashes=r.block_hashes + blocks))
    if not grown:
        return None
    note = f"contexts grow {GROW_TOKENS} tokens a turn ({grown} of {len(out)} requests past their first turn)"
    return replace(wl, requests=tuple(out), notes=(*wl.notes, note))


def fan_out(wl: Workload, seed: int) -> Workload | None:
    """Sub-agents forked every FANOUT_EVERY-th turn of a branch (module doc,
    `turns`); None when no branch reaches such a turn."""
    rng = np.random.default_rng(seed)
    next_id = max((r.req_id for r in wl.requests), default=-1) + 1
    turn = turns(wl)
    children: dict[int, list[int]] = {}
    added: list[Request] = []
    for r in wl.requests:
        k = turn[r.req_id][1]
        if k % FANOUT_EVERY != FANOUT_EVERY - 1:
            continue
        ids = []
        for j in range(FANOUT):
            tail = int(rng.integers(200, 2_000))
            blocks = r.block_hashes + tuple(_new_block(next_id, i, 2) for i in range(tail // wl.block_tokens))
            added.append(
                replace(
                    r,
                    req_id=next_id,
                    branch_id=f"{r.branch_id}/sub{k}.{j}",
                    parent_branch_id=r.branch_id,
                    arrival_s=r.arrival_s + 0.05 * (j + 1),
                    prompt_tokens=r.prompt_tokens + tail,
                    block_hashes=blocks,
                    last_in_branch=True,
                )
            )
            ids.append(next_id)
            next_id += 1
        children[r.req_id] = ids
    if not added:
        return None
    joined = tuple(
        replace(r, after=r.after + tuple(c for a in r.after for c in children.get(a, ()))) if r.after else r
        for r in wl.requests
    )
    reqs = tuple(sorted((*joined, *added), key=lambda r: (r.arrival_s, r.req_id)))
    return replace(wl, requests=reqs, notes=(*wl.notes, f"fan-out {FANOUT} every {FANOUT_EVERY} turns"))


def flip_loop(wl: Workload) -> Workload | None:
    """Closed -> open, open -> closed; None when no turn depends on another
    (a trace without sessions): both loops then replay it alike."""
    if not any(r.after for r in wl.requests):
        return None
    if not wl.closed_loop:
        return replace(wl, closed_loop=True, notes=(*wl.notes, "replayed closed"))
    return replace(wl, closed_loop=False, notes=(*wl.notes, "replayed open"))


Perturbation = Callable[[Workload, int], Workload | None]

# Name -> transform of the built case workload. `overload_3x` is applied to the load instead (`load_factor`).
PERTURBATIONS: dict[str, Perturbation | None] = {
    "output_x0.5": lambda wl, _seed: scale_outputs(wl, 0.5),
    "output_x2": lambda wl, _seed: scale_outputs(wl, 2.0),
    "contexts_grow": lambda wl, _seed: grow_contexts(wl),
    "fanout": fan_out,
    "loop_flip": lambda wl, _seed: flip_loop(wl),
    "overload_3x": None,
}


def load_factor(name: str, level_load: float) -> float:
    """Multiplier of the case's sessions: `overload_3x` takes the case from
    `level_load` x capacity to OVERLOAD x; every other perturbation keeps it."""
    return OVERLOAD / level_load if name == "overload_3x" else 1.0


def perturb(wl: Workload, name: str, seed: int) -> Workload | None:
    """The perturbed workload (None: this perturbation has no form for it)."""
    if name not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {name!r}; known: {', '.join(PERTURBATIONS)}")
    fn = PERTURBATIONS[name]
    return wl if fn is None else fn(wl, seed)
