"""Cluster-wide tenant limits: one budget per tenant, whichever replica serves it.

`ClusterLimits` admits a request with one atomic Lua script in Redis
(`_limit_scripts.ADMIT`): requests per minute and tokens per minute as
sliding windows, and concurrency as leases on in-flight requests, checked
and taken all at once, so a tenant at 60 requests/min gets 60 across all
replicas, not 60 per replica. In-flight leases are renewed every
`lease_s / 3` by the replica that holds them; a replica that dies frees its
tenants' slots when their leases lapse (`lease_s`, 15 s by default).

When Redis is unreachable (refused, or slower than `timeout_s`), admission
never fails with a 5xx and never becomes unlimited: each replica enforces
**its share** of every limit on its own, `share_of(policy, replicas)` —
requests/min, tokens/min, concurrency and (through the directory) active
branches each divided by the number of live replicas, rounded up, so the
cluster as a whole stays within the limit plus at most one request per
replica and window. `replicas()` is the last count of live replicas seen in
Redis (`gateway.control.membership`), else `EVOLVING_GATEWAY_REPLICAS`. The
shared circuit breaker keeps requests from each waiting out the timeout
while Redis is down; when it answers again, the admissions made locally in
the meantime are replayed into the Redis windows, so the window after the
outage counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.circuit import CircuitBreaker
from gateway.serving.policy import _limit_scripts as lua
from gateway.serving.policy.limits import WINDOW_S, TenantLimiter, check_model, refusal
from gateway.store.records import Policy

log = logging.getLogger(__name__)


def share_of(policy: Policy, replicas: int) -> Policy:
    """One replica's share of a tenant's limits while it enforces them alone."""
    n = max(1, replicas)

    def part(limit: int | None) -> int | None:
        return None if limit is None else max(1, math.ceil(limit / n))

    return dataclasses.replace(
        policy,
        requests_per_minute=part(policy.requests_per_minute),
        tokens_per_minute=part(policy.tokens_per_minute),
        max_concurrent=part(policy.max_concurrent),
        max_active_branches=part(policy.max_active_branches),
    )


@dataclass
class Admission:
    tenant_id: str
    admission_id: str
    tokens: int
    in_redis: bool  # else admitted by the local share (Redis unreachable)
    local_ticket: int = 0


@dataclass
class LimitStats:
    admitted_redis: int = 0
    admitted_local: int = 0  # while Redis was unreachable
    refused: int = 0
    redis_errors: int = 0
    replayed: int = 0


@dataclass
class _Local:
    """A tenant's local share while Redis is down: windows for its admissions."""

    limiter: TenantLimiter
    replay: list[tuple[str, float, int | None]] = field(default_factory=list)  # (id, unix t, tokens|None)


class ClusterLimits:
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica: str,
        *,
        breaker: CircuitBreaker | None = None,
        replicas: Callable[[], int] = lambda: 1,
        lease_s: float = 15.0,
        timeout_s: float = 0.5,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._r = client
        self._p = prefix
        self.replica = replica
        self.breaker = breaker or CircuitBreaker()
        self.replicas = replicas
        self.lease_s = lease_s
        self.timeout_s = timeout_s
        self._monotonic = monotonic
        self._clock = clock
        self._scripts = {
            n: client.register_script(getattr(lua, n)) for n in ("ADMIT", "RELEASE", "CANCEL", "RENEW", "REPLAY")
        }
        self._ids = itertools.count(1)
        self._inflight: dict[str, Admission] = {}  # admission id -> admission (both modes)
        self._local: dict[str, _Local] = {}  # tenant -> share, while Redis is (or was) down
        self.stats = LimitStats()
        self._task: asyncio.Task[None] | None = None

    def in_flight(self, tenant_id: str) -> int:
        """This replica's requests in flight for the tenant."""
        return sum(1 for a in self._inflight.values() if a.tenant_id == tenant_id)

    # -- admission ---------------------------------------------------------------------
    async def acquire(self, tenant_id: str, policy: Policy, *, model: str, tokens: int) -> Admission:
        """Admit one request costing `tokens` or raise `RateLimited` / `PermissionDenied`."""
        check_model(policy, model)
        adm = Admission(tenant_id, f"{self.replica}:{next(self._ids)}", tokens, in_redis=True)
        if self.breaker.allow(self._monotonic()):
            try:
                code, value = await asyncio.wait_for(self._admit_redis(adm, policy), self.timeout_s)
            except (RedisError, OSError, TimeoutError) as exc:
                self._redis_failed(exc)
            else:
                self._redis_ok()
                await self._replay()
                if code != "ok":
                    self.stats.refused += 1
                    raise refusal(policy, code=code, wait_s=max(0.0, float(value)), tokens=tokens)
                self.stats.admitted_redis += 1
                self._inflight[adm.admission_id] = adm
                return adm
        return self._admit_local(adm, policy)

    async def _admit_redis(self, adm: Admission, policy: Policy) -> tuple[str, str]:
        opt = lambda v: "" if v is None else str(int(v))  # noqa: E731
        reply = await self._scripts["ADMIT"](
            args=[
                self._p,
                adm.tenant_id,
                adm.admission_id,
                WINDOW_S,
                opt(policy.requests_per_minute),
                opt(policy.tokens_per_minute),
                adm.tokens,
                opt(policy.max_concurrent),
                self.lease_s,
            ]
        )
        code, value = reply
        return str(code), str(value)

    def _admit_local(self, adm: Admission, policy: Policy) -> Admission:
        share = share_of(policy, self.replicas())
        # concurrency is checked on `_inflight` (both modes), the model already
        windows = dataclasses.replace(share, max_concurrent=None, allowed_models=None)
        local = self._local.get(adm.tenant_id)
        if local is None:
            local = self._local[adm.tenant_id] = _Local(TenantLimiter(windows))
        else:
            local.limiter.update_policy(windows)
        if share.max_concurrent is not None and self.in_flight(adm.tenant_id) >= share.max_concurrent:
            self.stats.refused += 1
            raise refusal(share, code="concurrency_limit_exceeded", wait_s=0.0, tokens=adm.tokens)
        try:
            adm.local_ticket = local.limiter.acquire(model="", tokens=adm.tokens, now=self._monotonic())
        except Exception:
            self.stats.refused += 1
            raise
        local.replay.append((adm.admission_id, self._clock(), adm.tokens if policy.tokens_per_minute else None))
        adm.in_redis = False
        self.stats.admitted_local += 1
        self._inflight[adm.admission_id] = adm
        return adm

    async def release(self, adm: Admission) -> None:
        """The request ended."""
        self._inflight.pop(adm.admission_id, None)
        if adm.in_redis:
            await self._quietly("RELEASE", adm.tenant_id, adm.admission_id)
        elif (local := self._local.get(adm.tenant_id)) is not None:
            local.limiter.release()

    async def cancel(self, adm: Admission) -> None:
        """The request never ran: take it out of the windows too."""
        self._inflight.pop(adm.admission_id, None)
        if adm.in_redis:
            await self._quietly("CANCEL", adm.tenant_id, adm.admission_id, adm.tokens)
            return
        local = self._local.get(adm.tenant_id)
        if local is not None:
            local.limiter.cancel(adm.local_ticket)
            local.replay = [r for r in local.replay if r[0] != adm.admission_id]

    async def _quietly(self, script: str, *args: object) -> None:
        """A release or cancel: if Redis is down the lease lapses on its own."""
        if not self.breaker.allow(self._monotonic()):
            return
        try:
            await asyncio.wait_for(self._scripts[script](args=[self._p, *args]), self.timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self._redis_failed(exc)
        else:
            self._redis_ok()

    def _redis_failed(self, exc: BaseException) -> None:
        self.stats.redis_errors += 1
        if self.breaker.closed:
            log.warning(
                "tenant limits: Redis unreachable (%s: %s); each replica enforces limit / %d",
                type(exc).__name__,
                exc,
                max(1, self.replicas()),
            )
        self.breaker.failure(self._monotonic())

    def _redis_ok(self) -> None:
        if not self.breaker.closed:
            log.info("tenant limits: Redis reachable again")
        self.breaker.success()

    async def _replay(self) -> None:
        """Put the admissions made locally during an outage into the Redis windows."""
        if not self._local:
            return
        now = self._clock()
        args: list[object] = [self._p, WINDOW_S]
        for tenant, local in self._local.items():
            for admission_id, t, tokens in local.replay:
                if now - t < WINDOW_S:
                    args += [tenant, admission_id, repr(t), "" if tokens is None else str(tokens)]
        self._local.clear()
        if len(args) > 2:
            try:
                await asyncio.wait_for(self._scripts["REPLAY"](args=args), self.timeout_s)
                self.stats.replayed += (len(args) - 2) // 4
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("tenant limits: could not replay the local admissions: %s", exc)

    # -- leases ---------------------------------------------------------------------------
    async def renew_once(self) -> None:
        held = [a for a in self._inflight.values() if a.in_redis]
        if not held or not self.breaker.allow(self._monotonic()):
            return
        args: list[object] = [self._p, self.lease_s]
        for a in held:
            args += [a.tenant_id, a.admission_id]
        try:
            await asyncio.wait_for(self._scripts["RENEW"](args=args), self.timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self._redis_failed(exc)
        else:
            self._redis_ok()

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self.renew_once()

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew_loop(), name="limit-leases")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
