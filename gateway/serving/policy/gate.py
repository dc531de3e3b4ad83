"""`StoreTenantGate`: the `TenantGate` over the store.

Keys and policies are cached in memory and refreshed every
`refresh_interval_s` from the database (in a worker thread), so
authentication and admission never wait on the database and keep working
from the last snapshot while it is down. A key unknown to the snapshot is
looked up once in the database (created since the last refresh); unknown
prefixes are remembered for one interval so random keys cannot hammer the
store.

Changes reach the cache through the overrides bus (`on_event`, every
replica, within milliseconds): a revoked key is dropped from the cache at
once, before any database read, and any change to a tenant (policy, keys,
name, deletion) reloads the snapshot. The periodic refresh is the
reconciliation that heals a missed notice.

Limits: with `cluster` (a `ClusterLimits`, Redis) a tenant's requests and
tokens per minute and its concurrency are one budget across all replicas;
without, this process enforces them alone (`TenantLimiter`, one gateway).

Usage goes to the `EventSink` (buffered), never to the database directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from gateway.control.bus import KEY_REVOKED, TENANT_CHANGED, ClusterEvent
from gateway.http import errors
from gateway.serving.policy.admission import PriorityAdmission
from gateway.serving.policy.cluster_limits import ClusterLimits
from gateway.serving.policy.limits import TenantLimiter
from gateway.serving.policy.tenancy import TenantContext
from gateway.store import credentials, repository
from gateway.store.db import Database, StoreUnavailable
from gateway.store.records import KeyGrant, Policy, UsageRecord
from gateway.store.sink import EventSink

log = logging.getLogger(__name__)
_MAX_VERIFIED = 10_000  # keys remembered as matched (one snapshot's worth; emptied with it)


@dataclass(frozen=True)
class GateConfig:
    refresh_interval_s: float = 5.0  # how stale keys and policies may get
    global_max_concurrent: int | None = None  # cluster-wide in-flight cap (None: none)
    admission_wait_s: float = 10.0  # longest wait for a global slot before 429
    branch_retry_after_s: float = 5.0  # Retry-After when the branch cap is hit

    def __post_init__(self) -> None:
        if self.refresh_interval_s <= 0 or self.admission_wait_s < 0 or self.branch_retry_after_s <= 0:
            raise ValueError("refresh_interval_s and branch_retry_after_s must be > 0, admission_wait_s >= 0")
        if self.global_max_concurrent is not None and self.global_max_concurrent < 1:
            raise ValueError("global_max_concurrent must be >= 1 or None")


def tenant_context(grant: KeyGrant) -> TenantContext:
    """What the request path needs to know about the key's tenant."""
    policy = grant.policy
    return TenantContext(
        tenant_id=grant.tenant_id,
        name=grant.tenant_name,
        cache_salt=grant.cache_salt if policy.cache_isolation else "",
        priority=policy.priority,
        max_active_branches=policy.max_active_branches,
        kv_retention_blocks=policy.kv_retention_blocks,
        allowed_models=policy.allowed_models,
    )


class StoreTenantGate:
    """TenantGate with cached keys/policies, token buckets and priority admission.

    `clock` is monotonic seconds for the buckets (inject a fake in tests).
    Call `await start()` once on the serving loop and `await stop()` at exit.
    """

    def __init__(
        self,
        db: Database,
        sink: EventSink,
        *,
        config: GateConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        cluster: ClusterLimits | None = None,
    ) -> None:
        self.db = db
        self.sink = sink
        self.config = config or GateConfig()
        self.cluster = cluster
        self._clock = clock
        self._grants: dict[str, list[KeyGrant]] = {}  # prefix -> active keys
        self._policies: dict[str, Policy] = {}  # tenant_id -> policy
        self._limiters: dict[str, TenantLimiter] = {}
        self._unknown_prefixes: dict[str, float] = {}  # prefix -> clock when found unknown
        # key -> its tenant, for keys already matched against the snapshot: the key's HMAC and
        # the tenant's context once per snapshot, not per request. Emptied whenever the
        # snapshot changes (refresh, a revoked key, a deleted tenant); only valid keys enter.
        self._verified: dict[str, TenantContext] = {}
        self.admission = PriorityAdmission(
            limit=self.config.global_max_concurrent, max_wait_s=self.config.admission_wait_s
        )
        self.last_refresh_ok: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._refresh_lock = asyncio.Lock()
        self._refresh_pending = False

    # -- snapshot ------------------------------------------------------------

    def _apply(self, grants: list[KeyGrant]) -> None:
        by_prefix: dict[str, list[KeyGrant]] = {}
        policies: dict[str, Policy] = {}
        for grant in grants:
            by_prefix.setdefault(grant.prefix, []).append(grant)
            policies[grant.tenant_id] = grant.policy
        self._grants, self._policies = by_prefix, policies
        self._unknown_prefixes.clear()
        self._verified.clear()
        now = self._clock()
        for tenant_id, limiter in self._limiters.items():
            if tenant_id in policies and policies[tenant_id] != limiter.policy:
                limiter.update_policy(policies[tenant_id], now=now)

    async def refresh(self) -> bool:
        """Reload keys and policies. False (snapshot kept) if the store is down.

        Calls that arrive while a reload runs share one more reload after it
        (a burst of change notices costs two database reads, not one each)."""
        if self._refresh_lock.locked():
            if self._refresh_pending:
                return True
            self._refresh_pending = True
        async with self._refresh_lock:
            self._refresh_pending = False
            try:
                grants = await self.db.run_async(lambda s: repository.load_key_grants(s))
            except StoreUnavailable:
                log.warning("store unreachable; serving with cached keys and policies")
                return False
            self._apply(grants)
            self.last_refresh_ok = self._clock()
            return True

    def forget_key(self, key_id: str) -> bool:
        """Drop a revoked key from the cache now (no database read needed)."""
        dropped = False
        for prefix, grants in list(self._grants.items()):
            kept = [g for g in grants if g.key_id != key_id]
            if len(kept) != len(grants):
                dropped = True
                self._grants[prefix] = kept
        self._verified.clear()
        return dropped

    def forget_tenant(self, tenant_id: str) -> None:
        """Drop a deleted tenant's keys from the cache now."""
        for prefix, grants in list(self._grants.items()):
            self._grants[prefix] = [g for g in grants if g.tenant_id != tenant_id]
        self._verified.clear()

    async def on_event(self, event: ClusterEvent) -> None:
        """Overrides bus handler (every replica): apply a key or tenant change now."""
        if event.kind == KEY_REVOKED:
            self.forget_key(str(event.data.get("key_id", "")))
        elif event.kind == TENANT_CHANGED:
            if event.data.get("deleted"):
                self.forget_tenant(str(event.data.get("tenant_id", "")))
        else:
            return
        await self.refresh()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_interval_s)
            await self.refresh()

    async def start(self) -> None:
        """Load the first snapshot (best effort) and start periodic refresh."""
        await self.refresh()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop(), name="tenant-gate")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- TenantGate ----------------------------------------------------------

    def _match(self, api_key: str, grants: list[KeyGrant]) -> KeyGrant | None:
        for grant in grants:
            if credentials.verify_secret(
                api_key, salt=grant.salt, pepper=self.db.pepper, secret_hash=grant.secret_hash
            ):
                return grant
        return None

    async def _lookup(self, prefix: str) -> list[KeyGrant]:
        """Keys with this prefix from the database (a key newer than the snapshot)."""
        seen = self._unknown_prefixes.get(prefix)
        if seen is not None and self._clock() - seen < self.config.refresh_interval_s:
            return []
        try:
            grants = await self.db.run_async(lambda s: repository.load_key_grants(s, prefix=prefix))
        except StoreUnavailable:
            return []
        if not grants:
            self._unknown_prefixes[prefix] = self._clock()
            return []
        self._grants[prefix] = grants
        for grant in grants:
            self._policies[grant.tenant_id] = grant.policy
        return grants

    async def authenticate(self, api_key: str | None) -> TenantContext:
        if not api_key:
            raise errors.AuthenticationFailed(
                "You didn't provide an API key. Send it as `Authorization: Bearer <key>`."
            )
        known = self._verified.get(api_key)
        if known is not None:
            return known
        prefix = credentials.visible_prefix(api_key)
        grant = self._match(api_key, self._grants.get(prefix, []))
        if grant is None and prefix not in self._grants:
            grant = self._match(api_key, await self._lookup(prefix))
        if grant is None:
            raise errors.AuthenticationFailed("Incorrect API key provided.")
        tenant = tenant_context(grant)
        if len(self._verified) < _MAX_VERIFIED:
            self._verified[api_key] = tenant
        return tenant

    def policy_for(self, tenant_id: str) -> Policy:
        """The cached policy (default if the tenant is unknown to the snapshot)."""
        return self._policies.get(tenant_id, Policy())

    def _limiter(self, tenant_id: str) -> TenantLimiter:
        limiter = self._limiters.get(tenant_id)
        if limiter is None:
            limiter = self._limiters[tenant_id] = TenantLimiter(self.policy_for(tenant_id), now=self._clock())
        return limiter

    def admit(
        self, tenant: TenantContext, *, model: str, prompt_tokens: int, max_tokens: int
    ) -> contextlib.AbstractAsyncContextManager[None]:
        cost = max(0, prompt_tokens) + max(0, max_tokens)
        if self.cluster is not None:
            return self._admit_cluster(self.cluster, tenant, model=model, cost=cost)
        return _LocalSlot(self, tenant.tenant_id, model, cost)

    @contextlib.asynccontextmanager
    async def _admit_cluster(
        self, cluster: ClusterLimits, tenant: TenantContext, *, model: str, cost: int
    ) -> AsyncIterator[None]:
        policy = self.policy_for(tenant.tenant_id)
        adm = await cluster.acquire(tenant.tenant_id, policy, model=model, tokens=cost)
        try:
            await self.admission.acquire(policy.priority)
        except BaseException:
            await cluster.cancel(adm)
            raise
        try:
            yield
        finally:
            self.admission.release()
            await cluster.release(adm)

    def check_branch_limit(self, tenant: TenantContext, active_branches: int) -> None:
        """Raise `RateLimited` if the tenant may not open another branch now.

        `active_branches`: the tenant's active branches before the new one.
        """
        self._limiter(tenant.tenant_id).check_branches(active_branches, retry_after_s=self.config.branch_retry_after_s)

    def record_usage(self, usage: UsageRecord) -> None:
        self.sink.record_usage(usage)


class _LocalSlot:
    """One request slot of this process' own limits (`StoreTenantGate.admit`
    without a cluster): a plain class, as it is taken on every request."""

    __slots__ = ("_cost", "_gate", "_limiter", "_model", "_tenant_id")

    def __init__(self, gate: StoreTenantGate, tenant_id: str, model: str, cost: int) -> None:
        self._gate = gate
        self._tenant_id = tenant_id
        self._model = model
        self._cost = cost
        self._limiter: TenantLimiter | None = None

    async def __aenter__(self) -> None:
        gate = self._gate
        limiter = gate._limiter(self._tenant_id)
        ticket = limiter.acquire(model=self._model, tokens=self._cost, now=gate._clock())
        try:
            await gate.admission.acquire(limiter.policy.priority)
        except BaseException:
            limiter.cancel(ticket)
            raise
        self._limiter = limiter

    async def __aexit__(self, *exc: object) -> None:
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            self._gate.admission.release()
            limiter.release()
