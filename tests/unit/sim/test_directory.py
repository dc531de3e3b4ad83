"""The simulator's prefix index (`LocalDirectory`, `ChainLRU`) against a
brute-force reference with the semantics it must keep: per-block LRU host
stores refreshed on every publish, unreferenced blocks evicted first."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from sim.directory import DictHits, LayeredHits, LocalDirectory
from sim.lru import ChainLRU


class ReferenceIndex:
    """Fake for the tests: the index as plain per-block bookkeeping."""

    def __init__(self, blocks_per_node: int) -> None:
        self.cap = blocks_per_node
        self.stores: dict[str, OrderedDict[int, None]] = {}
        self.refs: dict[int, int] = {}
        self.branches: dict[str, set[int]] = {}

    def publish(self, node: str, hashes: tuple[int, ...]) -> None:
        store = self.stores.setdefault(node, OrderedDict())
        for h in hashes:
            store[h] = None
            store.move_to_end(h)
        over = len(store) - self.cap
        if over <= 0:
            return
        over += self.cap // 10
        window = list(store)[: 4 * over]
        victims = [h for h in window if h not in self.refs][:over]
        victims += [h for h in window if h in self.refs][: over - len(victims)]
        for h in victims:
            del store[h]

    def retain(self, branch: str, hashes: tuple[int, ...]) -> None:
        held = self.branches.setdefault(branch, set())
        for h in set(hashes) - held:
            self.refs[h] = self.refs.get(h, 0) + 1
        held |= set(hashes)

    def release(self, branch: str) -> None:
        for h in self.branches.pop(branch, ()):
            self.refs[h] -= 1
            if not self.refs[h]:
                del self.refs[h]

    def leading_runs(self, hashes: tuple[int, ...]) -> dict[str, int]:
        out = {}
        for node, store in self.stores.items():
            run = 0
            while run < len(hashes) and hashes[run] in store:
                run += 1
            out[node] = run
        return out

    def pool(self, hashes: tuple[int, ...]) -> int:
        n = 0
        while n < len(hashes) and any(hashes[n] in s for s in self.stores.values()):
            n += 1
        return n


class Prompts:
    """Chained prompts (the index's contract): a new prompt extends a prefix
    of an earlier one with fresh blocks, so a block id names its prefix."""

    def __init__(self, rng: random.Random, system: tuple[int, ...] = (1, 2, 3, 4)) -> None:
        self.rng, self.made, self.next_id = rng, [system], 100

    def new(self, max_new: int = 8) -> tuple[int, ...]:
        base = self.rng.choice(self.made)
        return self.extend(base[: self.rng.randrange(1, len(base) + 1)], max_new)

    def extend(self, base: tuple[int, ...], max_new: int = 8) -> tuple[int, ...]:
        fresh = tuple(range(self.next_id, self.next_id + self.rng.randrange(0, max_new + 1)))
        self.next_id += len(fresh)
        self.made.append(base + fresh)
        return base + fresh


def _check_same(index: LocalDirectory, ref: ReferenceIndex, probes: list[tuple[int, ...]]) -> None:
    assert {n: list(s) for n, s in index.stores.items()} == {n: list(s) for n, s in ref.stores.items()}
    assert index.refs == ref.refs
    for n, store in ref.stores.items():
        assert all(n in index.holders[h] for h in store)
    assert sum(len(s) for s in index.holders.values()) == sum(len(s) for s in ref.stores.values())
    nodes = sorted(ref.stores)
    for p in probes:
        pool, hits = index.lookup(p)
        expect = ref.leading_runs(p)
        assert pool == ref.pool(p)
        assert {n: hits.get(n) for n in nodes} == expect
        top = hits.top(3)
        assert top == DictHits({n: b for n, b in expect.items() if b}).top(3)[: len(top)]


@pytest.mark.parametrize("seed", range(6))
def test_local_index_keeps_the_reference_lru_order_hits_and_holders(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.choice([12, 40])  # small: most publishes evict
    index, ref = LocalDirectory(cap), ReferenceIndex(cap)
    prompts = Prompts(rng)
    nodes = [f"n{i}" for i in range(rng.choice([3, 12]))]
    branches: dict[str, tuple[int, ...]] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.55:
            node, p = rng.choice(nodes), prompts.new()
            index.publish(node, p)
            ref.publish(node, p)
        elif op < 0.8:
            b = f"b{rng.randrange(20)}"
            # the branch's next turn (its context grows), or any prompt
            p = prompts.extend(branches[b]) if b in branches and rng.random() < 0.5 else prompts.new()
            branches[b] = p
            index.retain(b, p)
            ref.retain(b, p)
        elif branches:
            b = rng.choice(sorted(branches))
            del branches[b]
            index.release(b)
            ref.release(b)
        if step % 10 == 0:
            _check_same(index, ref, [prompts.new(2) for _ in range(4)] + rng.sample(prompts.made, 4))
    assert index.evicted > 0


def test_local_index_shared_prefix_on_many_nodes_stays_exact_as_holders_change() -> None:
    """A system prefix on ~100 nodes while nodes gain and lose blocks; top()
    skips layers above 64 nodes."""
    rng = random.Random(5)
    index, ref = LocalDirectory(12), ReferenceIndex(12)
    prompts = Prompts(rng)
    nodes = [f"n{i:03d}" for i in range(100)]
    for step in range(400):
        node, p = rng.choice(nodes), prompts.new()
        index.publish(node, p)
        ref.publish(node, p)
        if step % 20:
            continue
        for q in [prompts.new(1), (1, 2, 99), (2, 3)]:
            _, hits = index.lookup(q)
            expect = ref.leading_runs(q)
            deep = sorted((n for n in expect if expect[n]), key=lambda n: (-expect[n], n))
            top = hits.top(4)
            assert top == deep[: len(top)]
            layer = sum(1 for n in expect if deep and expect[n] == expect[deep[0]])
            assert top or not deep or layer > LayeredHits.TOP_LAYER_MAX


def test_local_index_evicts_unreferenced_least_recently_published_blocks_first() -> None:
    index = LocalDirectory(blocks_per_node=10)  # over capacity: evict down to 9 (10 % hysteresis)
    index.retain("b", (1, 2))
    index.publish("n", (1, 2, 3, 4, 5))
    index.publish("n", (6, 7, 8))
    index.publish("n", (1, 2, 3))  # refreshed: 4 and 5 are now the oldest unreferenced
    index.publish("n", (9, 10, 11))
    assert list(index.stores["n"]) == [6, 7, 8, 1, 2, 3, 9, 10, 11]
    assert index.lookup((4,))[0] == 0 and index.lookup((1, 2, 3))[1].get("n") == 3
    index.release("b")
    index.publish("m", (1, 2))
    index.publish("n", (12, 13))  # 6, 7 are the oldest now
    assert list(index.stores["n"]) == [8, 1, 2, 3, 9, 10, 11, 12, 13]
    assert index.holders[1] == {"m", "n"} and index.holders[3] == {"n"} and 6 not in index.holders


def test_chain_lru_refreshes_covered_runs_and_keeps_the_rest_in_place() -> None:
    lru = ChainLRU()
    assert lru.touch((1, 2, 3)) == [1, 2, 3]
    assert lru.touch((1, 2, 3, 4)) == [4]
    assert lru.touch((1, 5, 6)) == [5, 6]  # leaves the first run after block 1
    assert list(lru) == [2, 3, 4, 1, 5, 6]
    lru.touch((1, 2))  # 2's run starts where it sits
    assert list(lru) == [3, 4, 5, 6, 1, 2]
    lru.remove([5, 3])
    assert list(lru) == [4, 6, 1, 2] and 3 not in lru and len(lru) == 4
    assert lru.touch((1, 2, 3, 4, 5)) == [3, 5]
    assert list(lru) == [6, 1, 2, 3, 4, 5]
    lru.remove([2])  # from the middle of a run
    assert list(lru) == [6, 1, 3, 4, 5]
    with pytest.raises(KeyError):
        lru.remove([2])


def test_chain_lru_keeps_a_growing_context_in_one_run_beside_the_shared_prefix() -> None:
    lru = ChainLRU()
    system = (1, 2, 3)
    a = system + tuple(range(100, 200))
    b = system + tuple(range(300, 310))
    lru.touch(a)
    lru.touch(b)
    run_a = lru.run_of[150]
    lru.touch(a + (900, 901))
    assert lru.run_of[150] is run_a is lru.run_of[901] and lru.run_of[1] is not run_a
    assert list(lru) == list(range(300, 310)) + [1, 2, 3] + list(range(100, 200)) + [900, 901]
