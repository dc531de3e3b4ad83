"""Trace rows -> closed-loop agent turns, and prefix hashes of agent text.

A trace records when each request started, not when it ended, so which turn
released which is inferred:

- Requests of one session that start at the same recorded time are one
  **wave**: an agent's parallel tool calls (or sub-agents) sent together.
  They stay concurrent: each depends on the whole previous wave, none on
  its siblings.
- Every request of the next wave depends on every request of the previous
  one (a join), and arrives its gap after the last of them finishes. The gap
  is what the trace shows beyond the previous wave's nominal service time
  (`NOMINAL_S_PER_OUTPUT_TOKEN` per output token), never negative.
- Requests without a session are independent (open loop).

Agent text has no block ids; `text_block_hashes` chains a hash over
`TEXT_BLOCK_CHARS`-character blocks (the last, partial block included), the
scheme the converted `agents/mooncake_style` files use, so a raw agent trace
and its converted file give the same prefix structure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from sim.workloads import NOMINAL_S_PER_OUTPUT_TOKEN, Request, Workload

TEXT_BLOCK_CHARS = 2_048  # ~512 tokens at 4 characters per token
SAME_TIME_S = 1e-6  # start times this close are "the same recorded time"

RawRow = tuple[float, str | None, int, int, tuple[int, ...]]  # arrival_s, session, prompt, output, hashes


def text_block_hashes(text: str, block_chars: int = TEXT_BLOCK_CHARS) -> tuple[int, ...]:
    """Chained 63-bit ids of `text`'s blocks: block i's id depends on blocks
    0..i, so equal ids mean an equal prefix."""
    out: list[int] = []
    digest = b""
    for start in range(0, len(text), block_chars):
        digest = hashlib.blake2b(digest + text[start : start + block_chars].encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "big") >> 1)
    return tuple(out)


def sessionize(raw: Sequence[RawRow], name: str, closed_loop: bool, block_tokens: int) -> Workload:
    """Rows -> Workload sorted by arrival, ids 0..n-1 (module doc)."""
    order = sorted(range(len(raw)), key=lambda i: (raw[i][0], i))
    reqs: list[Request] = []
    # per session: (start time of the current wave, the wave's ids, the previous wave's ids, their nominal end)
    waves: dict[str, tuple[float, list[int], tuple[int, ...], float]] = {}
    last: dict[str, int] = {}
    for new_id, i in enumerate(order):
        t, sess, p, o, h = raw[i]
        after: tuple[int, ...] = ()
        gap = 0.0
        if sess is not None and closed_loop:
            if sess in waves and t - waves[sess][0] <= SAME_TIME_S:
                start, ids, after, prev_end = waves[sess]
                ids.append(new_id)
            else:
                if sess in waves:
                    _, ids, _, _ = waves[sess]
                    after = tuple(ids)
                    prev_end = max(reqs[j].arrival_s + reqs[j].output_tokens * NOMINAL_S_PER_OUTPUT_TOKEN for j in ids)
                else:
                    prev_end = t
                waves[sess] = (t, [new_id], after, prev_end)
            gap = max(0.0, t - prev_end) if after else 0.0
        sid = sess if sess is not None else f"r{new_id}"
        if sess is not None and sess in last:
            reqs[last[sess]] = _not_last(reqs[last[sess]])
        reqs.append(
            Request(
                new_id,
                sid,
                f"{sid}/main" if sess is not None else sid,
                t,
                p,
                o,
                h,
                after=after,
                gap_s=gap,
                last_in_branch=True,
                kind=name,
            )
        )
        if sess is not None:
            last[sess] = new_id
    duration = (reqs[-1].arrival_s if reqs else 0.0) + 1.0
    return Workload(name, tuple(reqs), duration, block_tokens, closed_loop=closed_loop)


def _not_last(r: Request) -> Request:
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
        False,
        r.kind,
    )
