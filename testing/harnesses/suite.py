"""Run one harness for two turns against the harness cluster and judge it from
what the gateway says: its per-request records (`GET /admin/requests`:
status, branch, cached tokens of every generation request), its /metrics
counters, and its answers as the harness got them (status, `X-Branch-ID`,
usage, the stream, through the recording proxy).
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from testing.harnesses.cluster import HarnessCluster
from testing.harnesses.exchanges import Reading, read
from testing.harnesses.recorder import Exchange
from testing.harnesses.runners.agents_sdk import AgentsSDK
from testing.harnesses.runners.anthropic_sdk import AnthropicSDK
from testing.harnesses.runners.claude_code import ClaudeCode
from testing.harnesses.runners.codex import Codex
from testing.harnesses.runners.langgraph import LangGraph
from testing.harnesses.runners.opencode import OpenCode
from testing.harnesses.scratch import FOLLOW_UP, TASK, Scratch, TurnOutcome
from testing.harnesses.target import Harness, Target

HARNESSES: dict[str, Callable[[Target, Scratch], Harness]] = {
    "codex": Codex,
    "claude-code": ClaudeCode,
    "opencode": OpenCode,
    "openai-agents": AgentsSDK,
    "anthropic": AnthropicSDK,
    "langgraph": LangGraph,
}
PROMPTS = (TASK, FOLLOW_UP)
# Per turn, with a margin over what a turn took on 2 shared cores (bfloat16 on AMX, 2026-12-03):
# decode dominates (5-20 tokens/s, as loaded as the cores are), so a harness's bound follows how
# many answers a turn has and how long each may be. Codex: one answer up to the gateway's
# 1024-token default (56-212 s seen); Claude Code (7-76 s), OpenCode (20-35 s) and the Anthropic
# SDK (1-12 s) are held to MAX_OUTPUT_TOKENS a request; the Agents SDK (0.4-52 s) and LangGraph
# (1-41 s) send no cap (their defaults) and answer twice on the tool turn.
# On a 2 GHz EPYC without AVX-512 (float32, 2026-12-06) the model decoded ~4-5 tokens/s at the
# harnesses' contexts: Codex 247 s, the Agents SDK 142 s, and Claude Code past 180 s on both
# turns (it asks again after each answer cut at MAX_OUTPUT_TOKENS: three and more 256-token
# answers a turn, ~60 s each), so the bounds of the harnesses whose turn may hold ~1,000 tokens
# are Codex's.
TURN_TIMEOUT_S = {
    "codex": 420.0,
    "claude-code": 420.0,
    "opencode": 180.0,
    "openai-agents": 420.0,
    "anthropic": 120.0,
    "langgraph": 420.0,
}
MAX_OUTPUT_TOKENS = 256  # told to the harnesses whose config needs an output cap
LENGTH_STOPS = ("length", "max_tokens", "incomplete")
TIMED_OUT = 124  # run_cli's exit code for a turn past its timeout


@dataclass
class HarnessReport:
    """One harness's run; the first six fields are the benchmark's per-harness keys."""

    requests: int  # requests the harness sent (every path)
    non_2xx: int  # of those, answered with a status outside 2xx
    exit_code: int  # the last turn's that failed, else 0
    tool_round_trips: int  # requests whose newest input is a tool result
    branches: int  # distinct X-Branch-ID over its generation requests
    cached_tokens_last: int | None  # cached prompt tokens of its last generation request
    cached_by_turn: list[int | None] = field(default_factory=list)  # per turn, the most any request had
    # Sessions the harness opened: 1, plus a turn that could not continue the last one
    # (`TurnOutcome.continues_session`; only after a turn named in length_stopped_turns).
    sessions: int = 1
    # Turns the harness gave up on because its last answer stopped on the length limit (named, allowed).
    length_stopped_turns: list[int] = field(default_factory=list)
    generations: int = 0
    unparsed: int = 0  # generation answers (or streams) that did not parse
    stops: list[str | None] = field(default_factory=list)
    metrics_requests: int = 0  # the gateway's own count over the run (evolving_requests_total)
    metrics_non_2xx: int = 0
    # The gateway's own records of the run's generation requests (GET /admin/requests).
    records: int = 0
    records_non_2xx: int = 0
    records_branches: int = 0
    records_cached_last: int | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # why it is not ok; empty when it is

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> dict[str, Any]:
        keys = ("requests", "non_2xx", "exit_code", "tool_round_trips", "branches", "cached_tokens_last")
        return {k: getattr(self, k) for k in keys}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def request_counts(metrics_text: str, tenant: str) -> tuple[int, int]:
    """(requests, non-2xx) in evolving_requests_total for `tenant` and for requests without one ("-")."""
    total = bad = 0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name != "evolving_requests_total" or sample.labels.get("tenant") not in (tenant, "-"):
                continue
            n = int(sample.value)
            total += n
            if not sample.labels.get("status", "").startswith("2"):
                bad += n
    return total, bad


@dataclass(frozen=True)
class RecordView:
    """The gateway's request records of one run, summed (see `record_view`)."""

    requests: int = 0
    non_2xx: int = 0
    branches: int = 0
    cached_last: int | None = None


# The endpoints whose requests generate; count_tokens and models are recorded too, but a
# harness's generation count does not include them.
GENERATION_ENDPOINTS = frozenset({"chat", "completions", "responses", "messages"})


def record_view(records: list[dict[str, Any]], tenant: str, since: float) -> RecordView:
    """Summary of the gateway's records (`GET /admin/requests`, newest first) of generation
    requests started at or after `since` by `tenant`, or refused before its key was read."""
    mine = sorted(
        (
            r
            for r in records
            if r["start"] >= since and r["tenant"] in (tenant, None) and r["endpoint"] in GENERATION_ENDPOINTS
        ),
        key=lambda r: r["start"],
    )
    ok = [r for r in mine if 200 <= r["status"] < 300]
    return RecordView(
        requests=len(mine),
        non_2xx=len(mine) - len(ok),
        branches=len({r["branch_id"] for r in ok if r["branch_id"]}),
        cached_last=ok[-1]["cached_tokens"] if ok else None,
    )


def judge(
    forces_tool: bool,
    outcomes: list[TurnOutcome],
    exchanges: list[tuple[int, Exchange]],
    metrics: tuple[int, int],
    records: RecordView | None = None,
) -> HarnessReport:
    """The report of one run from what it recorded (pure; `exchanges` are (turn, exchange))."""
    readings: list[tuple[int, Reading]] = [(turn, read(ex)) for turn, ex in exchanges]
    gens = [(t, r) for t, r in readings if r.api != "other"]
    failed = [o.exit_code for o in outcomes if o.exit_code != 0]
    last_stop = {t: r.stop for t, r in gens}  # per turn, its last generation's stop
    length_stopped = [
        n for n, o in enumerate(outcomes)
        if o.exit_code not in (0, TIMED_OUT) and last_stop.get(n) in LENGTH_STOPS
    ]  # fmt: skip
    cached_by_turn: list[int | None] = []
    for n in range(len(outcomes)):
        values = [r.cached_tokens for t, r in gens if t == n and r.ok and r.cached_tokens is not None]
        cached_by_turn.append(max(values) if values else None)
    last_ok = [r for _, r in gens if r.ok]
    report = HarnessReport(
        requests=len(readings),
        non_2xx=sum(1 for _, r in readings if not r.ok),
        exit_code=failed[-1] if failed else 0,
        tool_round_trips=sum(1 for _, r in gens if r.tool_result and r.ok),
        branches=len({r.branch for _, r in gens if r.ok and r.branch}),
        cached_tokens_last=last_ok[-1].cached_tokens if last_ok else None,
        cached_by_turn=cached_by_turn,
        length_stopped_turns=length_stopped,
        sessions=1 + sum(1 for n, o in enumerate(outcomes) if n and not o.continues_session),
        generations=len(gens),
        unparsed=sum(1 for _, r in gens if r.ok and not r.parsed),
        stops=[r.stop for _, r in gens],
        metrics_requests=metrics[0],
        metrics_non_2xx=metrics[1],
        records=records.requests if records else 0,
        records_non_2xx=records.non_2xx if records else 0,
        records_branches=records.branches if records else 0,
        records_cached_last=records.cached_last if records else None,
        turns=[
            {
                "exit_code": o.exit_code,
                "elapsed_s": round(o.elapsed_s, 1),
                "tool_calls": o.tool_calls,
                "output": o.output[-600:],
                "detail": o.detail[-1200:],
            }
            for o in outcomes
        ],  # fmt: skip
    )
    report.failures = _failures(report, forces_tool, outcomes)
    if records is not None:
        report.failures += _record_failures(report)
    return report


def _record_failures(report: HarnessReport) -> list[str]:
    """Where the gateway's own records disagree with a clean run or with what the harness saw."""
    out = []
    if report.records_non_2xx:
        out.append(f"{report.records_non_2xx} non-2xx in the gateway's request records")
    if report.records != report.generations:
        out.append(f"the gateway recorded {report.records} generation requests, the harness sent {report.generations}")
    if report.records_branches != report.sessions:
        out.append(f"{report.records_branches} branches in the gateway's request records, {report.sessions} session(s)")
    return out


def _failures(report: HarnessReport, forces_tool: bool, outcomes: list[TurnOutcome]) -> list[str]:
    out = []
    exit_codes = [o.exit_code for o in outcomes]
    # A harness may give up on a turn whose last answer stopped on the length limit (the turn is
    # named in length_stopped_turns); a timeout is never that.
    for n, code in enumerate(exit_codes):
        if code and n not in report.length_stopped_turns:
            out.append(f"turn {n}: exit code {code}")
    if report.non_2xx or report.metrics_non_2xx:
        out.append(f"{report.non_2xx} non-2xx answers ({report.metrics_non_2xx} in the gateway's counters)")
    if report.unparsed:
        out.append(f"{report.unparsed} answers did not parse")
    if not report.generations:
        out.append("no generation request reached the gateway")
    for n, o in enumerate(outcomes[1:], start=1):
        if not o.continues_session and n - 1 not in report.length_stopped_turns:
            out.append(f"turn {n} opened a new session after a turn that did not stop on the length limit")
    if report.branches != report.sessions:
        out.append(f"{report.branches} branches for {report.sessions} harness session(s)")
    first, last = report.cached_by_turn[0], report.cached_by_turn[-1]
    # Cached tokens grow from turn to turn of one session (a new session starts cold).
    if (
        outcomes[-1].continues_session
        and len(report.cached_by_turn) > 1
        and not (last is not None and last > (first or 0))
    ):
        out.append(f"cached tokens did not grow across turns: {report.cached_by_turn}")
    if forces_tool and not report.tool_round_trips:
        out.append("no tool round trip")
    return out


def run_harness(cluster: HarnessCluster, name: str, *, timeout_s: float | None = None,
                max_output_tokens: int = MAX_OUTPUT_TOKENS, turns: int = 2,
                scratch_root: pathlib.Path | None = None) -> HarnessReport:  # fmt: skip
    """Run harness `name` for `turns` turns in a fresh scratch folder; the cluster runs one harness at a time.

    `timeout_s` bounds each turn (default: the harness's TURN_TIMEOUT_S)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"harness-{name}-", dir=scratch_root))
    scratch = Scratch.create(root)
    target = Target(
        base_url=cluster.proxy_url,
        api_key=cluster.api_key,
        model=cluster.model,
        context_tokens=cluster.config.context_tokens,
        max_output_tokens=max_output_tokens,
        timeout_s=timeout_s or TURN_TIMEOUT_S[name],
    )
    harness = HARNESSES[name](target, scratch)
    before = request_counts(cluster.metrics_text(), cluster.tenant_id)
    since = time.time()
    outcomes = []
    for n in range(turns):
        cluster.proxy.label = f"{name}/{n}"
        outcomes.append(harness.turn(n, PROMPTS[min(n, len(PROMPTS) - 1)]))
    cluster.proxy.label = ""
    after = request_counts(cluster.metrics_text(), cluster.tenant_id)
    records = record_view(cluster.admin("/requests?limit=10000")["requests"], cluster.tenant_id, since)
    exchanges = [(int(ex.label.rsplit("/", 1)[1]), ex) for ex in cluster.proxy.taken(f"{name}/")]
    return judge(harness.forces_tool, outcomes, exchanges, (after[0] - before[0], after[1] - before[1]), records)
