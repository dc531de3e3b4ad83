"""The gate every OpenAI request passes: who is calling, and may they now.

`TenantGate` is the port; `gateway.serving.policy` implements it over the store
(keys, policies, token buckets). `OpenTenantGate` serves a single default
tenant with no key and no limits (embedded demo with auth off, unit tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from gateway.store.records import UsageRecord


@dataclass(frozen=True)
class TenantContext:
    tenant_id: str
    name: str
    # Salt mixed into block hashes; tenants with different salts never share
    # cache. Empty only when an operator lets a tenant share the global pool.
    cache_salt: str
    priority: int = 1  # 0 = highest
    max_active_branches: int | None = None
    kv_retention_blocks: int | None = None
    allowed_models: tuple[str, ...] | None = None  # None: every model

    def allows_model(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


class TenantGate(Protocol):
    async def authenticate(self, api_key: str | None) -> TenantContext:
        """Raise `errors.AuthenticationFailed` for a missing/unknown/revoked key."""

    def admit(
        self, tenant: TenantContext, *, model: str, prompt_tokens: int, max_tokens: int
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one request slot for the duration of the `async with`.

        Raises `errors.RateLimited` (429 + Retry-After) when a request/token
        bucket or the concurrency cap is exceeded, `errors.PermissionDenied`
        when the model is not allowed. May wait in priority order when the
        cluster is saturated; never blocks forever.
        """

    def check_branch_limit(self, tenant: TenantContext, active_branches: int) -> None:
        """Raise `errors.RateLimited` if the tenant may not open another branch.

        `active_branches`: the tenant's active branches before the new one.
        Pure and synchronous (the caller opens the branch right after).
        """

    def record_usage(self, usage: UsageRecord) -> None:
        """Account finished usage. Must not block or raise on a store outage."""


class OpenTenantGate:
    """One tenant, no keys, no limits."""

    def __init__(self, tenant: TenantContext | None = None) -> None:
        self.tenant = tenant or TenantContext(tenant_id="default", name="default", cache_salt="default")
        self.usage: list[UsageRecord] = []

    async def authenticate(self, api_key: str | None) -> TenantContext:
        return self.tenant

    @contextlib.asynccontextmanager
    async def admit(
        self, tenant: TenantContext, *, model: str, prompt_tokens: int, max_tokens: int
    ) -> AsyncIterator[None]:
        yield

    def check_branch_limit(self, tenant: TenantContext, active_branches: int) -> None:
        return None

    def record_usage(self, usage: UsageRecord) -> None:
        self.usage.append(usage)
