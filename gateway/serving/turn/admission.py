"""Admission of a prepared request: the tenant's slot (rate, concurrency,
priority) and its branch, held for the request's lifetime."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

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

    def admitted(self, p: Prepared) -> AbstractAsyncContextManager[None]:
        """Hold the tenant's slot and the branch for the request's lifetime."""
        return _Admitted(self, p)


class _Admitted:
    """`Admission.admitted`: a plain class, not a generator-based context
    manager (two of those and an exit stack per request cost more than the
    admission's own work)."""

    __slots__ = ("_admission", "_p", "_slot")

    def __init__(self, admission: Admission, p: Prepared) -> None:
        self._admission = admission
        self._p = p
        self._slot: AbstractAsyncContextManager[None] | None = None

    async def __aenter__(self) -> None:
        # Checked before admission so a refused branch costs no rate-limit
        # budget, and again, atomically across replicas, when the directory
        # opens it (concurrent openers cannot overshoot the cap).
        a, p = self._admission, self._p
        span = start_span("admission", **{"evolving.tenant": p.tenant.tenant_id})  # limits, queueing, branch
        try:
            await a._check_new_branch(p)
            slot = a.gate.admit(
                p.tenant,
                model=a.model_name,
                prompt_tokens=len(p.job.prompt_token_ids),
                max_tokens=sum(job.sampling.max_tokens for job in p.jobs),
            )
            await slot.__aenter__()
            try:
                cap = None if p.branch.one_shot else p.tenant.max_active_branches
                opened = await a.directory.open_branch(
                    p.branch.key,
                    tenant_id=p.tenant.tenant_id,
                    parent_id=p.branch.parent_key,
                    session_id=p.branch.session_id,
                    kv_retention_blocks=p.tenant.kv_retention_blocks,
                    max_active_branches=cap,
                )
                if not opened:
                    a.gate.check_branch_limit(p.tenant, cap or 0)  # raises RateLimited
            except BaseException as exc:
                await slot.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        except RateLimited as exc:
            a.workload.count_rejection()  # offered load the planner must see, though refused
            end_span(span, error=exc.message)
            raise
        self._slot = slot
        end_span(span)
        a.workload.count_arrival()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        slot, self._slot = self._slot, None
        try:
            if self._p.branch.finish_at_end:
                await self._admission.directory.finish_branch(self._p.branch.key)
        finally:
            if slot is not None:
                await slot.__aexit__(exc_type, exc, tb)
