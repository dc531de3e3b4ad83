"""Trace replay at any load: replicate sessions, cut at a duration.

`scale(workload, load=K, seed=s)` turns a trace into K times its sessions:

- copy c = 0, 1, ..., ceil(K) - 1 of every session; the last copy of a
  fractional K holds each session with probability K - floor(K) (K < 1 is a
  random subset of the sessions). Sessions stay whole: their turns, waves
  and gaps are the trace's.
- copy 0 keeps the trace's times; every other copy is shifted by its own
  seeded offset, uniform in the replay window, cyclically: a session that
  would start past the window's end starts that much after its beginning,
  so the arrival rate stays level instead of piling up at the end.
  `window_s` (default: the trace's duration) spreads the copies over a
  longer window, copy 0 included: a short trace becomes a steady population
  of its agents (e.g. 24 tool-calling sessions of 3 minutes over 20).
- copies share no blocks: each copy's block ids are mapped one-to-one to
  ids of its own (a bijection, so ids still name their prefix), and its
  session and branch ids get a suffix. A copy is a different agent run,
  not a cache hit on another's context.

`cut(workload, duration_s)` makes `duration_s` the horizon: open-loop
requests (and session roots) starting at or after it are dropped, with every
turn that depends on them (they could never arrive).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from sim.workloads import Request, Workload

_MASK = (1 << 63) - 1
_MUL = 0x9E3779B97F4A7C15 & _MASK | 1  # odd: multiplication is a bijection mod 2^63
_ADD = 0xBF58476D1CE4E5B9


def copy_block_id(block: int, copy: int) -> int:
    """Copy `copy`'s id for a block (copy 0 keeps the trace's ids)."""
    if copy == 0:
        return block
    return (block * _MUL + copy * _ADD) & _MASK


def _sessions(wl: Workload) -> dict[str, list[Request]]:
    out: dict[str, list[Request]] = {}
    for r in wl.requests:
        out.setdefault(r.session_id, []).append(r)
    return out


def scale(wl: Workload, *, load: float, seed: int, window_s: float | None = None) -> Workload:
    """K = `load` times the trace's sessions over `window_s` (module doc)."""
    if not load > 0 or not math.isfinite(load):
        raise ValueError(f"load must be a positive number, got {load}")
    if window_s is not None and not window_s > 0:
        raise ValueError(f"the replay window must be > 0 s, got {window_s}")
    if load == 1 and window_s is None:
        return wl
    width = window_s if window_s is not None else wl.duration_s
    rng = np.random.default_rng([seed, 0x7ACE])
    sessions = _sessions(wl)
    full, part = int(math.floor(load)), load - math.floor(load)
    rows: list[tuple[float, int, int, Request]] = []  # new arrival, copy, old id, request
    for c in range(full + (1 if part > 1e-12 else 0)):
        offset = 0.0 if c == 0 and window_s is None else float(rng.uniform(0.0, width))
        keep = rng.random(len(sessions)) < (1.0 if c < full else part)
        for kept, reqs in zip(keep, sessions.values(), strict=True):
            if not kept:
                continue
            start = reqs[0].arrival_s
            shift = (start + offset) % width - start
            rows += [(r.arrival_s + shift, c, r.req_id, r) for r in reqs]
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    new_id = {(c, old): i for i, (_, c, old, _) in enumerate(rows)}
    out = [_copy(r, i, t, c, new_id) for i, (t, c, _, r) in enumerate(rows)]
    copies = full + (1 if part > 1e-12 else 0)
    note = f"load {load:g}: {copies} cop{'y' if copies == 1 else 'ies'} of {len(sessions)} sessions"
    note += f" (the last with {part:.0%} of them)" if part > 1e-12 and copies > 1 else ""
    note += f", start offsets over {width:g} s, seed {seed}"
    return replace(wl, requests=tuple(out), duration_s=width, notes=(*wl.notes, note))


def _copy(r: Request, req_id: int, t: float, c: int, new_id: dict[tuple[int, int], int]) -> Request:
    tag = "" if c == 0 else f"~{c}"
    return Request(
        req_id,
        r.session_id + tag,
        r.branch_id + tag,
        t,
        r.prompt_tokens,
        r.output_tokens,
        tuple(copy_block_id(h, c) for h in r.block_hashes) if c else r.block_hashes,
        None if r.parent_branch_id is None else r.parent_branch_id + tag,
        tuple(new_id[(c, a)] for a in r.after),
        r.gap_s,
        r.last_in_branch,
        r.kind,
    )


def cut(wl: Workload, duration_s: float) -> Workload:
    """`duration_s` becomes the horizon (module doc); ids renumbered 0..n-1."""
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration must be a positive number of seconds, got {duration_s}")
    dropped: set[int] = set()
    for r in wl.requests:  # sorted by arrival; a turn's dependencies come before it
        if (not r.after and r.arrival_s >= duration_s) or any(a in dropped for a in r.after):
            dropped.add(r.req_id)
    kept = [r for r in wl.requests if r.req_id not in dropped]
    new_id = {r.req_id: i for i, r in enumerate(kept)}
    reqs = tuple(replace(r, req_id=new_id[r.req_id], after=_remap(r.after, new_id)) for r in kept)
    notes = wl.notes
    if dropped:
        notes = (*notes, f"cut at {duration_s:g} s: {len(dropped)} of {len(wl.requests)} requests start later")
    return replace(wl, requests=reqs, duration_s=float(duration_s), notes=notes)


def _remap(ids: Iterable[int], new_id: dict[int, int]) -> tuple[int, ...]:
    return tuple(new_id[a] for a in ids)
