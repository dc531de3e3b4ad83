"""Stored Responses API turns, so `previous_response_id` can continue them.

Each stored turn keeps only what it added to the conversation: the input
messages of that request (system messages excluded: instructions do not
carry over, as OpenAI specifies) and its output as an assistant message,
plus the id of the turn it continued. `conversation(...)` walks the chain
back and returns the whole conversation, oldest first.

Retention: a turn can be continued for `ttl_s` seconds after it was stored
or last read (walking a chain refreshes every link); in memory at most
`max_entries` turns per gateway replica are kept, least recently used
dropped first. A continuation whose chain lost a link answers 404
`previous_response_not_found`, as OpenAI does for an unknown id. With
several gateway replicas the store is Redis (`EVOLVING_DIRECTORY_URL`,
keys in the cluster's `EVOLVING_REDIS_PREFIX`), bounded by the TTL alone.
Turns are scoped by tenant: another tenant's id is not found. `store:
false` requests are never stored.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

MAX_CHAIN = 10_000  # links followed before a chain counts as broken (guards against a cycle)


@dataclass
class StoredTurn:
    response_id: str
    tenant_id: str
    previous_id: str | None
    messages: list[dict[str, Any]]  # what this turn added: its inputs, then its output
    branch_id: str  # the branch its continuations join (no X-Branch-ID header)
    response: dict[str, Any] = field(default_factory=dict)  # the response object (GET /v1/responses/{id})
    created: float = 0.0


class ResponseStore(Protocol):
    async def get(self, tenant_id: str, response_id: str) -> StoredTurn | None:
        """The turn (refreshing its retention), or None: unknown, expired or another tenant's."""

    async def put(self, turn: StoredTurn) -> None: ...

    async def delete(self, tenant_id: str, response_id: str) -> bool: ...


async def conversation(store: ResponseStore, tenant_id: str, response_id: str) -> list[StoredTurn] | None:
    """The chain ending at `response_id`, oldest turn first; None when any link is gone."""
    chain: list[StoredTurn] = []
    next_id: str | None = response_id
    while next_id is not None:
        if len(chain) >= MAX_CHAIN:
            return None
        turn = await store.get(tenant_id, next_id)
        if turn is None:
            return None
        chain.append(turn)
        next_id = turn.previous_id
    chain.reverse()
    return chain


class MemoryResponseStore:
    """In-process store with TTL and an LRU bound (see the module docstring)."""

    def __init__(self, *, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._turns: collections.OrderedDict[tuple[str, str], tuple[float, StoredTurn]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    async def get(self, tenant_id: str, response_id: str) -> StoredTurn | None:
        key = (tenant_id, response_id)
        item = self._turns.get(key)
        now = self._clock()
        if item is None:
            return None
        if item[0] <= now:
            del self._turns[key]
            return None
        self._turns[key] = (now + self.ttl_s, item[1])
        self._turns.move_to_end(key)
        return item[1]

    async def put(self, turn: StoredTurn) -> None:
        key = (turn.tenant_id, turn.response_id)
        self._turns[key] = (self._clock() + self.ttl_s, turn)
        self._turns.move_to_end(key)
        while len(self._turns) > self.max_entries:
            self._turns.popitem(last=False)

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        return self._turns.pop((tenant_id, response_id), None) is not None


class RedisResponseStore:
    """The store on Redis (`redis.asyncio`), one JSON value per turn with an expiry.

    Keys are `<prefix>:<tenant>:<response id>`; the gateway passes its
    cluster namespace (`settings.redis_base + ":responses"`, as every other
    Redis key takes `EVOLVING_REDIS_PREFIX`), so two clusters sharing one
    Redis never read each other's turns. A Redis error propagates: the
    caller answers 503 for a continuation it cannot read, and serves
    (unstored) a turn it cannot write.
    """

    def __init__(self, client: Any, *, ttl_s: float, prefix: str) -> None:
        self._r = client
        self.ttl_s = ttl_s
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str, *, ttl_s: float, prefix: str) -> RedisResponseStore:
        import redis.asyncio

        return cls(redis.asyncio.Redis.from_url(url, decode_responses=True), ttl_s=ttl_s, prefix=prefix)

    def _key(self, tenant_id: str, response_id: str) -> str:
        return f"{self._prefix}:{tenant_id}:{response_id}"

    async def get(self, tenant_id: str, response_id: str) -> StoredTurn | None:
        key = self._key(tenant_id, response_id)
        raw = await self._r.getex(key, ex=int(self.ttl_s))
        if raw is None:
            return None
        return StoredTurn(**json.loads(raw))

    async def put(self, turn: StoredTurn) -> None:
        await self._r.set(self._key(turn.tenant_id, turn.response_id), json.dumps(asdict(turn)), ex=int(self.ttl_s))

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        return bool(await self._r.delete(self._key(tenant_id, response_id)))

    async def aclose(self) -> None:
        await self._r.aclose()
