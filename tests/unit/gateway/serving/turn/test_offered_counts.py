"""The service counts offered load for the planner: admitted and refused requests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from gateway.control.workload_feed import LocalWorkloadFeed
from gateway.http.errors import PermissionDenied, RateLimited
from gateway.serving.jobs import Job
from gateway.serving.policy.tenancy import TenantContext
from gateway.serving.turn.branch import parse_branch_headers
from gateway.serving.turn.prepare import Prepared
from gateway.serving.turn.service import TurnService
from workers.protocol import SamplingOptions

TENANT = TenantContext(tenant_id="t", name="t", cache_salt="t")


class FakeGate:
    """Admits, or refuses with the given error (a fake of the tenant gate)."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.refuse = refuse

    @contextlib.asynccontextmanager
    async def admit(self, tenant, *, model, prompt_tokens, max_tokens) -> AsyncIterator[None]:
        if self.refuse is not None:
            raise self.refuse
        yield

    def check_branch_limit(self, tenant, active_branches) -> None:
        return None


class FakeDirectory:
    def __init__(self) -> None:
        self.open: set[str] = set()

    async def open_branch(self, key: str, **kw) -> bool:
        self.open.add(key)
        return True

    async def finish_branch(self, key: str) -> bool:
        self.open.discard(key)
        return True


def _service(gate: FakeGate, feed: LocalWorkloadFeed) -> TurnService:
    return TurnService(
        model_name="m",
        tokenizer=None,  # type: ignore[arg-type]  # admission never tokenizes
        # Only admission runs here: no orchestrator, metrics or real gate/directory is reached.
        orchestrator=None,  # type: ignore[arg-type]
        gate=gate,  # type: ignore[arg-type]
        directory=FakeDirectory(),  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        default_max_tokens=8,
        workload=feed,
    )


def _prepared() -> Prepared:
    branch = parse_branch_headers("t", branch_id=None, parent_id=None, session_id=None, finished=None)
    job = Job("r1", [1, 2, 3], SamplingOptions(max_tokens=4), "salt", branch.key)
    return Prepared("r1", 0, TENANT, branch, job, [], False)


async def test_admitted_and_rate_limited_requests_are_counted_other_refusals_are_not() -> None:
    feed = LocalWorkloadFeed()
    for _ in range(3):
        async with _service(FakeGate(), feed).admitted(_prepared()):
            pass
    with pytest.raises(RateLimited):
        async with _service(FakeGate(RateLimited("busy", retry_after_s=1)), feed).admitted(_prepared()):
            pass
    with pytest.raises(PermissionDenied):  # not offered load: the tenant may not use this model at all
        async with _service(FakeGate(PermissionDenied("no")), feed).admitted(_prepared()):
            pass
    assert feed.counts() == (3, 1)
