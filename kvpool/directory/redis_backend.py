"""Redis directory: several gateway replicas share one directory.

`AsyncRedisDirectory` implements `AsyncBlockDirectory` over `redis.asyncio`,
so a slow Redis delays only the requests waiting on it, never the gateway's
event loop. Mutations are single Lua scripts (atomic per call across
replicas); reads are pipelined. One round trip per call: opening a branch
returns it as the script read it; a lookup's counters ride with its reads,
the blocks it hit with the next lookup (`flush_stats`, `stats` send them
sooner). Key layout: see `_redis_scripts`. Every
Redis failure (refused, reset, past the client's socket timeout) surfaces as
`DirectoryUnavailable`; losing Redis loses cache hits, never correctness.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kvpool.directory import _redis_scripts as lua
from kvpool.directory.base import (
    BranchEvent,
    BranchInfo,
    BranchLimitReached,
    BranchState,
    DirectoryStats,
    DirectoryUnavailable,
    PrefixHit,
    build_prefix_hit,
    next_branch_state,
    order_victims,
)


def _t(now: float) -> str:
    return repr(float(now))


class AsyncRedisDirectory:
    """AsyncBlockDirectory on Redis; see kvpool.directory.base for the contract.

    `client` (a `redis.asyncio.Redis`) must be created with
    decode_responses=True; give it a socket timeout, which bounds how long a
    stalled Redis can hold one call. `prefix` namespaces every key (tests use
    a unique one and call `clear()`).
    """

    def __init__(self, client: aioredis.Redis, prefix: str = "{kvpool}") -> None:
        if not client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("AsyncRedisDirectory needs a client with decode_responses=True")
        self._r = client
        self._p = prefix
        # Blocks hit by lookups whose counters went out before their result: sent with the next
        # lookup's round trip (or by `flush_stats`), so a lookup costs one round trip, not two.
        self._unsent_hits = 0
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
    def from_url(cls, url: str, prefix: str = "{kvpool}", *, socket_timeout_s: float = 1.0) -> AsyncRedisDirectory:
        client = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
        )
        return cls(client, prefix)

    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        try:
            yield
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            raise DirectoryUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    async def _run(self, name: str, *args: str | int) -> Any:
        """A Lua script's reply (its shape is the script's: the caller reads it)."""
        async with self._guard():
            return await self._scripts[name](args=[self._p, *args])

    def _k(self, *parts: str) -> str:
        return ":".join((self._p, *parts))

    async def clear(self) -> int:
        """Delete every key under the prefix (tests, operator reset)."""
        async with self._guard():
            keys = [k async for k in self._r.scan_iter(match=self._p + ":*", count=1000)]
            return int(await self._r.delete(*keys)) if keys else 0

    # -- locations -----------------------------------------------------
    async def publish(self, node_id: str, locations: Sequence[tuple[str, int]], block_bytes: int, now: float) -> None:
        flat: list[str | int] = []
        for h, slot in locations:
            flat += [h, int(slot)]
        await self._run("PUBLISH", node_id, int(block_bytes), _t(now), *flat)

    async def unpublish(self, node_id: str, block_hashes: Sequence[str]) -> None:
        if block_hashes:
            await self._run("UNPUBLISH", node_id, *block_hashes)

    async def drop_node(self, node_id: str) -> list[str]:
        return sorted(await self._run("DROP_NODE", node_id))

    async def longest_prefix(
        self,
        block_hashes: Sequence[str],
        *,
        prefer: str | None = None,
        exclude: Sequence[str] = (),
        record: bool = True,
    ) -> PrefixHit:
        pipe = self._r.pipeline(transaction=False)
        hits = 0
        if record:  # the counters ride with the reads: one round trip
            hits, self._unsent_hits = self._unsent_hits, 0
            self._count(pipe, len(block_hashes), hits)
        for h in block_hashes:
            pipe.hgetall(self._k("loc", h))
        try:
            async with self._guard():
                replies = await pipe.execute() if len(pipe) else []
        except DirectoryUnavailable:
            self._unsent_hits += hits
            raise
        raw: list[dict[str, str]] = replies[len(replies) - len(block_hashes) :]
        per_block = [{n: int(s) for n, s in m.items()} for m in raw]
        hit = build_prefix_hit(per_block, prefer=prefer, exclude=exclude)
        if record:
            self._unsent_hits += hit.num_blocks
        return hit

    def _count(self, pipe: Any, blocks: int, hits: int) -> None:
        """A lookup's counters (`stats`): the hits known so far go with it."""
        pipe.hincrby(self._k("stats"), "lookups", 1)
        pipe.hincrby(self._k("stats"), "looked_up_blocks", blocks)
        if hits:
            pipe.hincrby(self._k("stats"), "hit_blocks", hits)

    async def flush_stats(self) -> None:
        """Send the hit counts not sent yet (`stats` does it first; a replica
        that stops does it last)."""
        hits, self._unsent_hits = self._unsent_hits, 0
        if hits:
            try:
                async with self._guard():
                    await self._r.hincrby(self._k("stats"), "hit_blocks", hits)
            except DirectoryUnavailable:
                self._unsent_hits += hits
                raise

    async def touch_blocks(self, node_id: str, block_hashes: Sequence[str], now: float) -> None:
        if block_hashes:
            await self._run("TOUCH_BLOCKS", node_id, _t(now), *block_hashes)

    # -- branches ------------------------------------------------------
    async def open_branch(
        self,
        branch_id: str,
        tenant_id: str,
        now: float,
        parent_id: str | None = None,
        session_id: str | None = None,
        max_active: int | None = None,
    ) -> BranchInfo:
        cap = "" if max_active is None else str(int(max_active))
        opened = await self._run("OPEN_BRANCH", branch_id, tenant_id, _t(now), parent_id or "", session_id or "", cap)
        if opened == -2:
            raise BranchLimitReached(tenant_id, await self.active_branch_count(tenant_id))
        return _info(branch_id, _pairs(opened), BranchState.ACTIVE)  # as the script read it, atomically

    def _not_active(self, branch_id: str, event: BranchEvent) -> None:
        next_branch_state(None, event, branch_id)  # raises BranchStateError

    async def touch(self, branch_id: str, now: float) -> None:
        if await self._run("TOUCH", branch_id, _t(now)) == -1:
            self._not_active(branch_id, BranchEvent.TOUCH)

    async def reference(self, branch_id: str, block_hashes: Sequence[str], now: float) -> int:
        added = int(await self._run("REFERENCE", branch_id, _t(now), *block_hashes))
        if added == -1:
            self._not_active(branch_id, BranchEvent.REFERENCE)
        return added

    async def _release(self, branch_id: str, cutoff: str, event: BranchEvent) -> BranchInfo | None:
        flat = await self._run("RELEASE", branch_id, cutoff)
        if not flat:
            return None
        state = next_branch_state(BranchState.ACTIVE, event, branch_id)
        return _info(branch_id, _pairs(flat), state)

    async def finish_branch(self, branch_id: str) -> BranchInfo | None:
        return await self._release(branch_id, "", BranchEvent.FINISH)

    async def expire(self, now: float, idle_ttl_s: float) -> list[str]:
        cutoff = _t(now - idle_ttl_s)
        async with self._guard():
            # decode_responses=True: members and fields come back as str (redis-py types every reply shape).
            stale = cast("list[str]", await self._r.zrangebyscore(self._k("active"), "-inf", cutoff))
        return sorted([b for b in stale if await self._release(b, cutoff, BranchEvent.EXPIRE)])

    async def branch(self, branch_id: str) -> BranchInfo | None:
        async with self._guard():
            pipe = self._r.pipeline(transaction=True)
            pipe.hgetall(self._k("br", branch_id))
            pipe.zscore(self._k("size"), branch_id)
            fields, size = cast("tuple[dict[str, str], float | None]", await pipe.execute())
        if not fields:
            return None
        return _info(branch_id, {**fields, "size": repr(size or 0.0)}, BranchState.ACTIVE)

    async def ref_counts(self, block_hashes: Sequence[str]) -> list[int]:
        if not block_hashes:
            return []
        async with self._guard():
            return [int(v or 0) for v in await self._r.hmget(self._k("refs"), list(block_hashes))]

    async def branch_blocks(self, tenant_id: str) -> int:
        async with self._guard():
            return int(await self._r.hlen(self._k("trefs", tenant_id)))

    async def tenant_ref_counts(self, tenant_id: str, block_hashes: Sequence[str]) -> list[int]:
        if not block_hashes:
            return []
        async with self._guard():
            return [int(v or 0) for v in await self._r.hmget(self._k("trefs", tenant_id), list(block_hashes))]

    async def active_branch_count(self, tenant_id: str) -> int:
        async with self._guard():
            return int(await self._r.scard(self._k("tbr", tenant_id)))

    async def top_branches(self, n: int) -> list[BranchInfo]:
        async with self._guard():
            sizes = cast("list[tuple[str, float]]", await self._r.zrange(self._k("size"), 0, -1, withscores=True))
        ranked = sorted(sizes, key=lambda kv: (-kv[1], kv[0]))[: max(n, 0)]
        infos = [await self.branch(b) for b, _ in ranked]
        return [i for i in infos if i is not None]

    # -- eviction and stats ---------------------------------------------
    async def choose_victims(self, node_id: str, n: int) -> list[str]:
        async with self._guard():
            held = cast(
                "list[tuple[str, float]]", await self._r.zrange(self._k("held", node_id), 0, -1, withscores=True)
            )
        refs = await self.ref_counts([h for h, _ in held])
        entries = [(h, at, r) for (h, at), r in zip(held, refs, strict=False)]
        return order_victims(entries)[: max(n, 0)]

    async def eviction_order(self, node_id: str, candidates: Sequence[str]) -> list[str]:
        unique = list(dict.fromkeys(candidates))
        if not unique:
            return []
        async with self._guard():
            times = await self._r.zmscore(self._k("held", node_id), unique)
        refs = await self.ref_counts(unique)
        return order_victims(list(zip(unique, times, refs, strict=False)))

    async def stats(self) -> DirectoryStats:
        await self.flush_stats()
        async with self._guard():
            pipe = self._r.pipeline(transaction=True)
            pipe.get(self._k("nblocks"))
            pipe.hgetall(self._k("nodes"))
            pipe.hlen(self._k("refs"))
            pipe.zcard(self._k("active"))
            pipe.hgetall(self._k("stats"))
            nblocks, nodes, nrefs, nactive, counters = await pipe.execute()
            held: list[int] = []
            if nodes:
                pipe = self._r.pipeline(transaction=False)
                for node in nodes:
                    pipe.zcard(self._k("held", node))
                held = await pipe.execute()
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
