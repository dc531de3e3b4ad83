"""What a turn leaves behind: per finished job the planner's sample, the
metrics, the trace's turn attributes and the tenant's usage; per request one
`RequestRecord` and the request counter (the only place either is written)."""

from __future__ import annotations

import time
from typing import Any

from gateway.control.workload_feed import WorkloadFeed
from gateway.metrics import GatewayMetrics
from gateway.serving.jobs import Finished
from gateway.serving.policy.tenancy import TenantGate
from gateway.serving.turn.branch import BranchContext
from gateway.serving.turn.requestlog import RequestLog, RequestRecord
from gateway.store.records import UsageRecord
from gateway.telemetry import turn_finished
from planner.types import RequestSample


def usage_dict(done: list[Finished]) -> dict[str, Any]:
    """One request's usage over its choices: the prompt once, every choice's output."""
    first = done[0]
    completion = sum(d.completion_tokens for d in done)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }


class Accounting:
    def __init__(
        self, model_name: str, gate: TenantGate, metrics: GatewayMetrics, workload: WorkloadFeed, log: RequestLog
    ) -> None:
        self.model_name = model_name
        self.gate = gate
        self.metrics = metrics
        self.workload = workload
        self.log = log

    def job_finished(self, tenant_id: str, branch: BranchContext, done: Finished) -> None:
        """Record one finished job: planner sample, metrics, trace, tenant usage."""
        arrival = time.time() - done.e2e_s
        self.workload.add(
            RequestSample(
                t=arrival,
                uncached_prompt_tokens=done.prompt_tokens - done.cached_tokens,
                cached_prompt_tokens=done.cached_tokens,
                output_tokens=done.completion_tokens,
                e2e_s=done.e2e_s,
                ttft_s=done.ttft_s,
            ),
            branch=None if branch.one_shot else branch.key,
            last_in_branch=branch.finish_at_end,
        )
        self.metrics.observe_finished(tenant_id, done)
        turn_finished(
            prompt_tokens=done.prompt_tokens,
            cached_tokens=done.cached_tokens,
            completion_tokens=done.completion_tokens,
            finish_reason=done.finish_reason.value,
            first_phase=done.first_phase.value if done.first_phase is not None else "",
            nodes=done.nodes,
            resumes=done.resumes,
            ttft_s=done.ttft_s,
        )
        self.gate.record_usage(
            UsageRecord(
                tenant_id=tenant_id,
                model=self.model_name,
                prompt_tokens=done.prompt_tokens,
                cached_tokens=done.cached_tokens,
                completion_tokens=done.completion_tokens,
            )
        )

    def stream_cut(self, tenant_id: str) -> None:
        """A stream the gateway's shutdown ended mid-answer (`StreamCut`)."""
        self.metrics.observe_stream_cut(tenant_id)

    def request_done(self, record: RequestRecord) -> None:
        """The request's record and its count (tenant "-": refused before its key was read)."""
        self.metrics.observe_request(record.tenant or "-", record.endpoint, record.status)
        self.log.add(record)
