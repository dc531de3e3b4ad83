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
branches each divided by the number of live replicas, rounded up. The share
is checked against *everything this replica admitted* in the last minute
(every admission is also counted in a local window, in both modes), so
traffic from before the outage counts too. `replicas()` is the count of
live replicas seen in Redis (`gateway.control.membership`; a Redis that
restarted empty does not shrink it), else `EVOLVING_GATEWAY_REPLICAS`.

What that guarantees: in the minutes after Redis went away the cluster
admits at most the limit (plus one request per replica from rounding up);
within the minute it went away, up to (2 - 1/replicas) x the limit when all
earlier traffic had gone to one replica (that replica is over its share and
admits nothing more; the others admit theirs). The shared circuit breaker
keeps requests from each waiting out the timeout while Redis is down. When
Redis answers again, this replica's admissions of the last minute are put
back into the Redis windows (idempotent: an id Redis still has is not
counted twice), so a Redis that restarted empty still counts them; a
background probe does it within `recover_s` of Redis returning (whatever
the breaker's backoff), and closes the breaker.
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

from gateway.kv.circuit import CircuitBreaker
from gateway.serving.policy import _limit_scripts as lua
from gateway.serving.policy.limits import WINDOW_S, TenantLimiter, check_model, refusal
from gateway.store.records import Policy

# What a Lua script's ARGV takes (redis-py encodes each).
ScriptArg = str | int | float

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
    """A tenant's admissions on this replica over the last window: the local
    share's check while Redis is down, and what to replay into Redis after."""

    limiter: TenantLimiter
    admitted: list[tuple[str, float, int, int]] = field(default_factory=list)  # (id, unix t, tokens, ticket)


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
        recover_s: float = 0.5,
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
        self.recover_s = recover_s
        self._monotonic = monotonic
        self._clock = clock
        self._scripts = {
            n: client.register_script(getattr(lua, n)) for n in ("ADMIT", "RELEASE", "CANCEL", "RENEW", "REPLAY")
        }
        self._ids = itertools.count(1)
        self._inflight: dict[str, Admission] = {}  # admission id -> admission (both modes)
        self._local: dict[str, _Local] = {}  # tenant -> this replica's admissions of the last window
        self._replay_needed = False
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
                if self._replay_needed:
                    await asyncio.wait_for(self._replay(), self.timeout_s)
                code, value = await asyncio.wait_for(self._admit_redis(adm, policy), self.timeout_s)
            except (RedisError, OSError, TimeoutError) as exc:
                self._redis_failed(exc)
            else:
                self._redis_ok()
                if code != "ok":
                    self.stats.refused += 1
                    raise refusal(policy, code=code, wait_s=max(0.0, float(value)), tokens=tokens)
                self.stats.admitted_redis += 1
                self._remember(adm, policy, checked=False)
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

    def _window(self, tenant_id: str, policy: Policy) -> _Local:
        """The tenant's local windows, sized to this replica's share of the policy."""
        share = share_of(policy, self.replicas())
        # concurrency is counted in `_inflight` (both modes); the model was checked already
        windows = dataclasses.replace(share, max_concurrent=None, allowed_models=None)
        local = self._local.get(tenant_id)
        if local is None:
            local = self._local[tenant_id] = _Local(TenantLimiter(windows))
        elif local.limiter.policy != windows:
            local.limiter.update_policy(windows)
        now = self._clock()
        local.admitted = [a for a in local.admitted if now - a[1] < WINDOW_S]
        return local

    def _remember(self, adm: Admission, policy: Policy, *, checked: bool) -> None:
        """Count the admission locally (both modes) and hold it as in flight."""
        if policy.requests_per_minute is not None or policy.tokens_per_minute is not None:
            local = self._window(adm.tenant_id, policy)
            if not checked:
                adm.local_ticket = local.limiter.record(tokens=adm.tokens, now=self._monotonic())
            local.admitted.append((adm.admission_id, self._clock(), adm.tokens, adm.local_ticket))
        self._inflight[adm.admission_id] = adm

    def _admit_local(self, adm: Admission, policy: Policy) -> Admission:
        share = share_of(policy, self.replicas())
        if share.max_concurrent is not None and self.in_flight(adm.tenant_id) >= share.max_concurrent:
            self.stats.refused += 1
            raise refusal(share, code="concurrency_limit_exceeded", wait_s=0.0, tokens=adm.tokens)
        if policy.requests_per_minute is not None or policy.tokens_per_minute is not None:
            local = self._window(adm.tenant_id, policy)
            try:
                adm.local_ticket = local.limiter.acquire(model="", tokens=adm.tokens, now=self._monotonic())
            except Exception:
                self.stats.refused += 1
                raise
            local.limiter.release()  # in flight is tracked in `_inflight`; the windows keep the admission
        adm.in_redis = False
        self.stats.admitted_local += 1
        self._remember(adm, policy, checked=True)
        return adm

    async def release(self, adm: Admission) -> None:
        """The request ended."""
        self._inflight.pop(adm.admission_id, None)
        if adm.in_redis:
            await self._quietly("RELEASE", adm.tenant_id, adm.admission_id)

    async def cancel(self, adm: Admission) -> None:
        """The request never ran: take it out of the windows too."""
        self._inflight.pop(adm.admission_id, None)
        local = self._local.get(adm.tenant_id)
        if local is not None:
            local.limiter.forget(adm.local_ticket)
            local.admitted = [a for a in local.admitted if a[0] != adm.admission_id]
        if adm.in_redis:
            await self._quietly("CANCEL", adm.tenant_id, adm.admission_id, adm.tokens)

    async def _quietly(self, script: str, *args: ScriptArg) -> None:
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
        self._replay_needed = True
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
        """Put this replica's admissions of the last minute back into the Redis windows."""
        now = self._clock()
        args: list[ScriptArg] = [self._p, WINDOW_S]
        for tenant, local in self._local.items():
            for admission_id, t, tokens, _ in local.admitted:
                if now - t < WINDOW_S:
                    args += [tenant, admission_id, repr(t), str(tokens)]
        if len(args) > 2:
            await self._scripts["REPLAY"](args=args)
            self.stats.replayed += (len(args) - 2) // 4
        self._replay_needed = False

    # -- leases ---------------------------------------------------------------------------
    async def renew_once(self) -> None:
        held = [a for a in self._inflight.values() if a.in_redis]
        if not held or not self.breaker.allow(self._monotonic()):
            return
        args: list[ScriptArg] = [self._p, self.lease_s]
        for a in held:
            args += [a.tenant_id, a.admission_id]
        try:
            await asyncio.wait_for(self._scripts["RENEW"](args=args), self.timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self._redis_failed(exc)
        else:
            self._redis_ok()

    async def recover_once(self) -> bool:
        """After an outage, replay this replica's minute as soon as Redis answers
        (not at its next request: every replica's admissions are back at once).

        Every `recover_s`, whatever the breaker's backoff: a replica still
        waiting out its backoff after Redis returned would admit on its local
        share while the others, back on Redis, see windows without its
        admissions. A background probe blocks no request."""
        if not self._replay_needed:
            return False
        try:
            await asyncio.wait_for(self._replay(), self.timeout_s)
        except (RedisError, OSError, TimeoutError):
            return False  # still down: the breaker keeps the request path on the local share
        self._redis_ok()
        return True

    async def _renew_loop(self) -> None:
        last_renew = self._monotonic()
        while True:
            await asyncio.sleep(self.recover_s)
            await self.recover_once()
            if self._monotonic() - last_renew >= self.lease_s / 3:
                last_renew = self._monotonic()
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
