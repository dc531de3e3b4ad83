"""Redis BlockDirectory: several gateway replicas share one directory.

Mutations are single Lua scripts (atomic per call across replicas); reads are
pipelined. Key layout: see `_redis_scripts`. Losing Redis loses cache hits,
never correctness: callers treat a redis.RedisError as "no hit".
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from kvpool.directory import _redis_scripts as lua
from kvpool.directory.base import (
    BranchEvent,
    BranchInfo,
    BranchState,
    DirectoryStats,
    PrefixHit,
    build_prefix_hit,
    next_branch_state,
    order_victims,
)


def _t(now: float) -> str:
    return repr(float(now))


class RedisDirectory:
    """BlockDirectory on Redis; see kvpool.directory.base for the contract.

    `client` must be created with decode_responses=True. `prefix` namespaces
    every key (tests use a unique one and call `clear()`).
    """

    def __init__(self, client: redis.Redis, prefix: str = "{kvpool}") -> None:
        if not client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("RedisDirectory needs a client with decode_responses=True")
        self._r = client
        self._p = prefix
        self._scripts = {
            name: client.register_script(getattr(lua, name))
            for name in (
                "PUBLISH",
                "UNPUBLISH",
                "DROP_NODE",
                "TOUCH_BLOCKS",
                "OPEN_BRANCH",
                "TOUCH",
                "REFERENCE",
                "RELEASE",
            )
        }

    @classmethod
    def from_url(cls, url: str, prefix: str = "{kvpool}") -> RedisDirectory:
        return cls(redis.Redis.from_url(url, decode_responses=True), prefix)

    def _run(self, name: str, *args: object) -> object:
        return self._scripts[name](args=[self._p, *args])

    def _k(self, *parts: str) -> str:
        return ":".join((self._p, *parts))

    def clear(self) -> int:
        """Delete every key under the prefix (tests, operator reset)."""
        keys = list(self._r.scan_iter(match=self._p + ":*", count=1000))
        return int(self._r.delete(*keys)) if keys else 0

    # -- locations -----------------------------------------------------
    def publish(self, node_id: str, locations: Sequence[tuple[str, int]], block_bytes: int, now: float) -> None:
        flat: list[object] = []
        for h, slot in locations:
            flat += [h, int(slot)]
        self._run("PUBLISH", node_id, int(block_bytes), _t(now), *flat)

    def unpublish(self, node_id: str, block_hashes: Sequence[str]) -> None:
        if block_hashes:
            self._run("UNPUBLISH", node_id, *block_hashes)

    def drop_node(self, node_id: str) -> list[str]:
        return sorted(self._run("DROP_NODE", node_id))

    def longest_prefix(
        self,
        block_hashes: Sequence[str],
        *,
        prefer: str | None = None,
        exclude: Sequence[str] = (),
        record: bool = True,
    ) -> PrefixHit:
        pipe = self._r.pipeline(transaction=False)
        for h in block_hashes:
            pipe.hgetall(self._k("loc", h))
        raw = pipe.execute() if block_hashes else []
        per_block = [{n: int(s) for n, s in m.items()} for m in raw]
        hit = build_prefix_hit(per_block, prefer=prefer, exclude=exclude)
        if record:
            pipe = self._r.pipeline(transaction=True)
            pipe.hincrby(self._k("stats"), "lookups", 1)
            pipe.hincrby(self._k("stats"), "looked_up_blocks", len(block_hashes))
            pipe.hincrby(self._k("stats"), "hit_blocks", hit.num_blocks)
            pipe.execute()
        return hit

    def touch_blocks(self, node_id: str, block_hashes: Sequence[str], now: float) -> None:
        if block_hashes:
            self._run("TOUCH_BLOCKS", node_id, _t(now), *block_hashes)

    # -- branches ------------------------------------------------------
    def open_branch(
        self,
        branch_id: str,
        tenant_id: str,
        now: float,
        parent_id: str | None = None,
        session_id: str | None = None,
    ) -> BranchInfo:
        self._run("OPEN_BRANCH", branch_id, tenant_id, _t(now), parent_id or "", session_id or "")
        info = self.branch(branch_id)
        if info is None:  # finished by another replica in between
            return self.open_branch(branch_id, tenant_id, now, parent_id, session_id)
        return info

    def _not_active(self, branch_id: str, event: BranchEvent) -> None:
        next_branch_state(None, event, branch_id)  # raises BranchStateError

    def touch(self, branch_id: str, now: float) -> None:
        if self._run("TOUCH", branch_id, _t(now)) == -1:
            self._not_active(branch_id, BranchEvent.TOUCH)

    def reference(self, branch_id: str, block_hashes: Sequence[str], now: float) -> int:
        added = int(self._run("REFERENCE", branch_id, _t(now), *block_hashes))
        if added == -1:
            self._not_active(branch_id, BranchEvent.REFERENCE)
        return added

    def _release(self, branch_id: str, cutoff: str, event: BranchEvent) -> BranchInfo | None:
        flat = self._run("RELEASE", branch_id, cutoff)
        if not flat:
            return None
        state = next_branch_state(BranchState.ACTIVE, event, branch_id)
        return _info(branch_id, _pairs(flat), state)  # type: ignore[arg-type]

    def finish_branch(self, branch_id: str) -> BranchInfo | None:
        return self._release(branch_id, "", BranchEvent.FINISH)

    def expire(self, now: float, idle_ttl_s: float) -> list[str]:
        cutoff = _t(now - idle_ttl_s)
        stale = self._r.zrangebyscore(self._k("active"), "-inf", cutoff)
        return sorted(b for b in stale if self._release(b, cutoff, BranchEvent.EXPIRE))

    def branch(self, branch_id: str) -> BranchInfo | None:
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(self._k("br", branch_id))
        pipe.zscore(self._k("size"), branch_id)
        fields, size = pipe.execute()
        if not fields:
            return None
        return _info(branch_id, {**fields, "size": size or 0}, BranchState.ACTIVE)

    def ref_counts(self, block_hashes: Sequence[str]) -> list[int]:
        if not block_hashes:
            return []
        return [int(v or 0) for v in self._r.hmget(self._k("refs"), list(block_hashes))]

    def branch_blocks(self, tenant_id: str) -> int:
        return int(self._r.hlen(self._k("trefs", tenant_id)))

    def tenant_ref_counts(self, tenant_id: str, block_hashes: Sequence[str]) -> list[int]:
        if not block_hashes:
            return []
        return [int(v or 0) for v in self._r.hmget(self._k("trefs", tenant_id), list(block_hashes))]

    def active_branch_count(self, tenant_id: str) -> int:
        return int(self._r.scard(self._k("tbr", tenant_id)))

    def top_branches(self, n: int) -> list[BranchInfo]:
        sizes = self._r.zrange(self._k("size"), 0, -1, withscores=True)
        ranked = sorted(sizes, key=lambda kv: (-kv[1], kv[0]))[: max(n, 0)]
        infos = (self.branch(b) for b, _ in ranked)
        return [i for i in infos if i is not None]

    # -- eviction and stats ---------------------------------------------
    def choose_victims(self, node_id: str, n: int) -> list[str]:
        held = self._r.zrange(self._k("held", node_id), 0, -1, withscores=True)
        refs = self.ref_counts([h for h, _ in held])
        entries = [(h, at, r) for (h, at), r in zip(held, refs, strict=False)]
        return order_victims(entries)[: max(n, 0)]

    def eviction_order(self, node_id: str, candidates: Sequence[str]) -> list[str]:
        unique = list(dict.fromkeys(candidates))
        if not unique:
            return []
        times = self._r.zmscore(self._k("held", node_id), unique)
        refs = self.ref_counts(unique)
        return order_victims(list(zip(unique, times, refs, strict=False)))

    def stats(self) -> DirectoryStats:
        pipe = self._r.pipeline(transaction=True)
        pipe.get(self._k("nblocks"))
        pipe.hgetall(self._k("nodes"))
        pipe.hlen(self._k("refs"))
        pipe.zcard(self._k("active"))
        pipe.hgetall(self._k("stats"))
        nblocks, nodes, nrefs, nactive, counters = pipe.execute()
        pipe = self._r.pipeline(transaction=False)
        for node in nodes:
            pipe.zcard(self._k("held", node))
        held = pipe.execute() if nodes else []
        return DirectoryStats(
            blocks=int(nblocks or 0),
            bytes=sum(c * int(bb) for c, bb in zip(held, nodes.values(), strict=False)),
            referenced_blocks=int(nrefs),
            active_branches=int(nactive),
            lookups=int(counters.get("lookups", 0)),
            looked_up_blocks=int(counters.get("looked_up_blocks", 0)),
            hit_blocks=int(counters.get("hit_blocks", 0)),
        )


def _pairs(flat: Sequence[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=False))


def _info(branch_id: str, f: dict[str, str], state: BranchState) -> BranchInfo:
    return BranchInfo(
        branch_id=branch_id,
        tenant_id=f["tenant"],
        parent_id=f.get("parent") or None,
        session_id=f.get("session") or None,
        state=state,
        opened_at=float(f["opened"]),
        last_active_at=float(f["last"]),
        num_blocks=int(float(f.get("size", 0))),
    )
