"""The overrides bus: a change made through one replica's admin API reaches
every replica at once.

An admin write (planner mode, pins, API key revoked or created, policy
changed, tenant renamed or deleted) publishes one `ClusterEvent` after it is
applied locally (and, for tenants and keys, committed). Handlers run on
every replica: the overrides service applies modes and pins, the tenant gate
drops a revoked key from its cache and reloads keys and policies.

- `LocalBus`: one process; handlers run right away (also what a lone
  gateway uses, so the replica that served the call applies at once).
- `RedisBus`: Redis pub/sub on `<p>:bus`. The publishing replica's handlers
  run at once too (its own message is skipped when it comes back), the
  others' within one pub/sub delivery (milliseconds).

Pub/sub is at-most-once: a replica that was disconnected misses messages.
So every replica also reconciles from the store every `EVOLVING_RECONCILE_S`
(keys and policies reloaded, overrides compared by version), and after its
subscription reconnects it runs every handler's `on_resync` at once.
Handlers must be idempotent and must not raise (failures are logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 5.0  # the longest stop() waits for the listener

# Event kinds on the wire (`ClusterEvent.kind`); the typed events below carry their fields.
KEY_REVOKED = "key.revoked"
TENANT_CHANGED = "tenant.changed"
ADMIN_TOKEN_REVOKED = "admin_token.revoked"
OVERRIDE = "override"


@dataclass(frozen=True)
class KeyRevoked:
    """An API key was revoked: every replica drops it from its cache."""

    KIND: ClassVar[str] = KEY_REVOKED
    key_id: str
    tenant_id: str = ""


@dataclass(frozen=True)
class TenantChanged:
    """A tenant's policy, keys or name changed, or it was deleted."""

    KIND: ClassVar[str] = TENANT_CHANGED
    tenant_id: str
    deleted: bool = False


@dataclass(frozen=True)
class AdminTokenRevoked:
    KIND: ClassVar[str] = ADMIN_TOKEN_REVOKED
    token_id: str


@dataclass(frozen=True)
class OverrideChanged:
    """A planner mode or pin (`gateway.store.records` keys) set at `version`."""

    KIND: ClassVar[str] = OVERRIDE
    key: str
    value: Any  # JSON: the mode, the split pin, a node's phase, or None (cleared)
    version: float


BusEvent = KeyRevoked | TenantChanged | AdminTokenRevoked | OverrideChanged
_EVENT_TYPES: dict[str, type[BusEvent]] = {
    t.KIND: t for t in (KeyRevoked, TenantChanged, AdminTokenRevoked, OverrideChanged)
}


@dataclass(frozen=True)
class ClusterEvent:
    """One published event as it travels: its kind and fields (`data`), who
    published it and when. `payload()` is the typed event."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    origin: str = ""  # the replica that published it
    t: float = 0.0  # unix seconds at publication

    @classmethod
    def of(cls, event: BusEvent, origin: str, t: float) -> ClusterEvent:
        return cls(event.KIND, dataclasses.asdict(event), origin, t)

    def payload(self) -> BusEvent | None:
        """The typed event; None for an unknown kind or malformed fields
        (a newer replica's event: ignored, not fatal)."""
        event_type = _EVENT_TYPES.get(self.kind)
        if event_type is None:
            return None
        try:
            return event_type(**self.data)
        except TypeError:
            return None

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "data": self.data, "origin": self.origin, "t": self.t})

    @classmethod
    def from_json(cls, raw: str | bytes) -> ClusterEvent:
        obj = json.loads(raw)
        return cls(
            kind=str(obj["kind"]),
            data=dict(obj.get("data") or {}),
            origin=str(obj.get("origin", "")),
            t=float(obj.get("t", 0.0)),
        )


Handler = Callable[[ClusterEvent], Awaitable[None]]
Resync = Callable[[], Awaitable[object]]  # its result is not read


class _Handlers:
    def __init__(self) -> None:
        self.handlers: list[Handler] = []
        self.resyncs: list[Resync] = []
        self.delivered = 0

    def subscribe(self, handler: Handler, *, on_resync: Resync | None = None) -> None:
        self.handlers.append(handler)
        if on_resync is not None:
            self.resyncs.append(on_resync)

    async def deliver(self, event: ClusterEvent) -> None:
        self.delivered += 1
        for handler in self.handlers:
            try:
                await handler(event)
            except Exception:  # one broken handler must not stop the others
                log.exception("bus handler failed on %s", event.kind)

    async def resync(self) -> None:
        for fn in self.resyncs:
            try:
                await fn()
            except Exception:
                log.exception("bus resync failed")


class LocalBus(_Handlers):
    """One process: `publish` runs every handler before it returns."""

    def __init__(self, replica: str = "local", clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.replica = replica
        self._clock = clock

    async def publish(self, published: BusEvent) -> ClusterEvent:
        event = ClusterEvent.of(published, self.replica, self._clock())
        await self.deliver(event)
        return event

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class RedisBus(_Handlers):
    """Redis pub/sub; see the module docstring for delivery and healing."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica: str,
        *,
        retry_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self._r = client
        self.channel = f"{prefix}:bus"
        self.replica = replica
        self._retry_s = retry_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()  # set: stop() is under way (a cancel alone can be swallowed)
        self.subscribed = asyncio.Event()
        self.publish_failures = 0

    async def publish(self, published: BusEvent) -> ClusterEvent:
        event = ClusterEvent.of(published, self.replica, self._clock())
        await self.deliver(event)  # this replica at once
        try:
            await self._r.publish(self.channel, event.to_json())
        except (RedisError, OSError) as exc:
            # The others heal at their next reconciliation from the store.
            self.publish_failures += 1
            log.warning("overrides bus unreachable (%s): %s reaches other replicas by reconciliation", exc, event.kind)
        return event

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._stopping.clear()
            self._task = asyncio.get_running_loop().create_task(self._listen(), name="overrides-bus")
        with contextlib.suppress(TimeoutError):  # Redis down: start anyway, reconciliation covers
            await asyncio.wait_for(self.subscribed.wait(), 2.0)

    async def stop(self) -> None:
        if self._task is not None:
            # A cancel that lands as redis-py's socket timeout fires can come
            # out as a TimeoutError (a RedisError the listener retries on).
            self._stopping.set()
            self._task.cancel()
            _, pending = await asyncio.wait([self._task], timeout=STOP_TIMEOUT_S)
            if pending:
                log.warning("overrides bus: the listener did not stop within %.0f s", STOP_TIMEOUT_S)
            self._task = None

    async def _listen(self) -> None:
        first = True
        while not self._stopping.is_set():
            pubsub = self._r.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.subscribed.set()
                if not first:  # messages may have been missed while disconnected
                    log.info("overrides bus reconnected; resynchronising from the store")
                    await self.resync()
                first = False
                while not self._stopping.is_set():
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is None or msg.get("type") != "message":
                        continue
                    try:
                        event = ClusterEvent.from_json(msg["data"])
                    except (ValueError, KeyError, TypeError):
                        log.warning("malformed bus message ignored")
                        continue
                    if event.origin != self.replica:
                        await self.deliver(event)
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                if self._stopping.is_set():
                    return
                log.warning("overrides bus disconnected (%s); retrying", exc)
                await asyncio.sleep(self._retry_s)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
