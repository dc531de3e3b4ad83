"""Host-store eviction policies backed by the directory's reference counts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvpool.store import EvictionPolicy


def referenced_last(ref_counts: Callable[[Sequence[str]], Sequence[int]]) -> EvictionPolicy:
    """Unreferenced blocks least-recently-used first, referenced ones last.

    `ref_counts` is typically `BlockDirectory.ref_counts` (Redis: one HMGET
    per eviction) or a worker-side cache of the counts the gateway sends. It
    runs under the store's lock: keep it fast and never call the store.
    """

    def policy(candidates: list[str], n: int) -> list[str]:
        counts = ref_counts(candidates)
        order = sorted(range(len(candidates)), key=lambda i: (counts[i] > 0, i))
        return [candidates[i] for i in order[:n]]

    return policy
