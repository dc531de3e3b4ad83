"""Admission of a prepared request: the tenant's slot (rate, concurrency,
priority) and its branch, held for the request's lifetime."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from gateway.control.workload_feed import WorkloadFeed
from gateway.http.errors import RateLimited
from gateway.kv.directory import Directory
from gateway.serving.policy.tenancy import TenantGate
from gateway.serving.turn.prepare import Prepared
from gateway.telemetry import end_span, start_span


class Admission:
    def __init__(self, model_name: str, gate: TenantGate, directory: Directory, workload: WorkloadFeed) -> None:
        self.model_name = model_name
        self.gate = gate
        self.directory = directory
        self.workload = workload

    async def _check_new_branch(self, p: Prepared) -> None:
        """The tenant's branch cap, for a request that opens a named branch.

        One-request branches (no X-Branch-ID) are exempt: they end with the
        request, which `max_concurrent` already bounds.
        """
        if p.tenant.max_active_branches is None or p.branch.one_shot:
            return
        if not await self.directory.is_branch_active(p.branch.key):
            self.gate.check_branch_limit(p.tenant, await self.directory.active_branch_count(p.tenant.tenant_id))

    @contextlib.asynccontextmanager
    async def admitted(self, p: Prepared) -> AsyncIterator[None]:
        """Hold the tenant's slot and the branch for the request's lifetime."""
        # Checked before admission so a refused branch costs no rate-limit
        # budget, and again, atomically across replicas, when the directory
        # opens it (concurrent openers cannot overshoot the cap).
        async with contextlib.AsyncExitStack() as held:
            span = start_span("admission", **{"evolving.tenant": p.tenant.tenant_id})  # limits, queueing, branch
            try:
                await self._check_new_branch(p)
                await held.enter_async_context(
                    self.gate.admit(
                        p.tenant,
                        model=self.model_name,
                        prompt_tokens=len(p.job.prompt_token_ids),
                        max_tokens=sum(job.sampling.max_tokens for job in p.jobs),
                    )
                )
                cap = None if p.branch.one_shot else p.tenant.max_active_branches
                opened = await self.directory.open_branch(
                    p.branch.key,
                    tenant_id=p.tenant.tenant_id,
                    parent_id=p.branch.parent_key,
                    session_id=p.branch.session_id,
                    kv_retention_blocks=p.tenant.kv_retention_blocks,
                    max_active_branches=cap,
                )
                if not opened:
                    self.gate.check_branch_limit(p.tenant, cap or 0)  # raises RateLimited
            except RateLimited as exc:
                self.workload.count_rejection()  # offered load the planner must see, though refused
                end_span(span, error=exc.message)
                raise
            end_span(span)
            self.workload.count_arrival()
            try:
                yield
            finally:
                if p.branch.finish_at_end:
                    await self.directory.finish_branch(p.branch.key)
