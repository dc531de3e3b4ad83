"""A node's host store for the simulator's prefix index: LRU order over
blocks, where refreshing a prompt costs work per *run*, not per block.

Agents' prompts grow to hundreds of blocks and every turn refreshes all of
them on one or two nodes: even one dict write per block was the largest
cost of a 3,072-GPU run (one cache miss each). A run is a stretch of
consecutive positions of one prompt whose blocks sit together in LRU order;
the store is a list of runs, least recently used first. Touching a prompt
walks its runs (a branch's context is one run, the shared system prompt
another), splits off the parts it does not cover (re-pointing the smaller
side), moves what it covers to the most-recent end, and appends its new
blocks to the run before them.

Contract: a block id names its whole prefix (chained hashes, as kvpool's
and the traces' are): a prompt that holds block h holds it at the same
position, after the same blocks. `tests/unit/bench/test_sim_index.py` checks
the order against plain per-block LRU bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class _Run:
    __slots__ = ("ref", "a", "b", "prev", "next")

    def __init__(self, ref: tuple[int, ...], a: int, b: int) -> None:
        self.ref, self.a, self.b = ref, a, b  # blocks ref[a:b], positions a..b-1
        # `prev` is None while the run is out of the list; `next` is only read while it is in.
        self.prev: _Run | None = None
        self.next: _Run = self


class ChainLRU:
    def __init__(self) -> None:
        self.run_of: dict[int, _Run] = {}
        self._head = _Run((), 0, 0)  # sentinel: head.next is the LRU run, head.prev the MRU one
        self._head.prev = self._head.next = self._head

    def __len__(self) -> int:
        return len(self.run_of)

    def __contains__(self, block: object) -> bool:
        return block in self.run_of

    def __iter__(self) -> Iterator[int]:
        """Held blocks, least recently used first."""
        r = self._head.next
        while r is not self._head:
            yield from r.ref[r.a : r.b]
            r = r.next

    def oldest(self, k: int) -> list[int]:
        """The `k` least recently used blocks (fewer if fewer are held), LRU first."""
        out: list[int] = []
        r = self._head.next
        while r is not self._head and len(out) < k:
            out += r.ref[r.a : min(r.b, r.a + k - len(out))]
            r = r.next
        return out

    def touch(self, prompt: tuple[int, ...]) -> list[int]:
        """Make the prompt's blocks the most recently used (in prompt
        order, the last one most); returns those that were not held."""
        run_of, n, i = self.run_of, len(prompt), 0
        covered: list[_Run] = []
        added: list[int] = []
        while i < n:
            r = run_of.get(prompt[i])
            if r is None:  # a stretch of new blocks: extends the run before it, or starts one
                j = i + 1
                while j < n and prompt[j] not in run_of:
                    j += 1
                if covered:
                    r = covered[-1]  # it ends at i
                    r.ref, r.b = prompt, j
                else:
                    r = _Run(prompt, i, j)
                    covered.append(r)
                for h in prompt[i:j]:
                    run_of[h] = r
                added += prompt[i:j]
                i = j
                continue
            assert r.a == i, "block ids must name their prefix"
            e = min(r.b, n)
            if r.ref[e - 1] != prompt[e - 1]:  # the prompt leaves this run: find where
                lo, hi = i + 1, e - 1  # ref[lo-1] == prompt[lo-1], ref[hi] != prompt[hi]
                while lo < hi:
                    mid = (lo + hi) // 2
                    if r.ref[mid] == prompt[mid]:
                        lo = mid + 1
                    else:
                        hi = mid
                e = lo
            if e < r.b:
                r = self._split(r, e)[0]
            covered.append(r)
            i = e
        head = self._head
        for r in covered:  # to the MRU end, in prompt order; never merged (shared prefixes stay their own runs)
            if r.prev is not None:
                self._unlink(r)
            self._link_before(r, head)
        return added

    def remove(self, blocks: Iterable[int]) -> None:
        """Drop held blocks (KeyError for one not held)."""
        run_of = self.run_of
        for h in blocks:
            r = run_of[h]
            if r.ref[r.a] == h:  # the usual case: LRU order is run order
                r.a += 1
            elif r.ref[r.b - 1] == h:
                r.b -= 1
            else:
                r = self._split(r, r.ref.index(h, r.a, r.b))[1]  # [p, b): then drop its first block
                r.a += 1
            del run_of[h]
            if r.a >= r.b:
                self._unlink(r)

    # -- internals ------------------------------------------------------------
    def _split(self, r: _Run, at: int) -> tuple[_Run, _Run]:
        """Cut r into [a, at) and [at, b), adjacent in LRU order; the smaller
        part is the new object (its blocks are re-pointed)."""
        if at - r.a <= r.b - at:
            part = _Run(r.ref, r.a, at)
            r.a = at
            self._link_before(part, r)
            self._point(part)
            return part, r
        part = _Run(r.ref, at, r.b)
        r.b = at
        self._link_before(part, r.next)
        self._point(part)
        return r, part

    def _point(self, r: _Run) -> None:
        run_of = self.run_of
        for h in r.ref[r.a : r.b]:
            run_of[h] = r

    def _link_before(self, r: _Run, nxt: _Run) -> None:
        prv = nxt.prev
        assert prv is not None
        r.prev, r.next = prv, nxt
        prv.next = nxt.prev = r

    def _unlink(self, r: _Run) -> None:
        assert r.prev is not None
        r.prev.next, r.next.prev = r.next, r.prev
        r.prev = None
