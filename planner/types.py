"""Plain data shared by the planner, the simulator and the gateway's loop.

No I/O, no imports from the project's I/O layers. Units: seconds unless a name
says `_ms`; token counts are ints.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from core import Phase


class PlannerMode(str, enum.Enum):
    AUTO = "auto"  # decide and act
    ADVISORY = "advisory"  # decide and record, never act
    MANUAL = "manual"  # never act; operators switch by hand


@dataclass(frozen=True)
class IterationRecord:
    """One engine iteration on one node (vLLM's per-iteration details)."""

    node_id: str
    phase: Phase
    t: float  # end of the iteration, unix seconds (or sim seconds)
    batch_size: int  # requests in the batch
    uncached_prompt_tokens: int  # prompt tokens computed this iteration
    cached_prompt_tokens: int  # prefix tokens of those requests served from cache
    generated_tokens: int  # decode tokens produced this iteration
    context_tokens: int  # total KV tokens attended by the decode requests
    elapsed_ms: float
    # Σ over the iteration's prompts of uncached·(uncached + context before
    # them): attention is per request. None: unknown, taken as one prompt.
    attention_pairs: float | None = None
    # Share of the CPU the engine got while it wanted it during the step:
    # ran / (ran + waited on a run queue), from the kernel's schedstat. 1:
    # nothing else competed for its cores. None: not measured.
    cpu_share: float | None = None
    # CPU µs a fixed reference computation took on this host around the step
    # (`workers.host_speed`): higher on a slow spell of the host that the
    # share does not see. None: not measured.
    host_probe_us: float | None = None


@dataclass(frozen=True)
class RequestSample:
    """One finished request as the gateway saw it (workload estimate input)."""

    t: float  # arrival time
    uncached_prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    e2e_s: float | None = None  # arrival to last token
    gap_s: float | None = None  # closed loop: since the branch's previous request finished (None: unknown)
    ttft_s: float | None = None  # arrival to first token (None: not reported)


@dataclass(frozen=True)
class NodeState:
    node_id: str
    phase: Phase
    draining: bool = False
    pinned: bool = False  # an operator pinned this node's phase
    queue: int = 0  # waiting requests
    running: int = 0
    kv_usage: float = 0.0  # 0..1 of device KV in use
    kv_capacity_tokens: int = 0  # device KV of the node, tokens (0: unknown)
    # The node's engine limits, as it reports them (0: unknown, the estimator's defaults apply):
    max_batch: int = 0  # requests per iteration (vLLM max_num_seqs)
    token_budget: int = 0  # tokens per iteration (vLLM max_num_batched_tokens)


@dataclass(frozen=True)
class Pin:
    """Operator override. A split pin fixes the number of prefill nodes."""

    prefill_nodes: int | None = None
    node_phases: dict[str, Phase] = field(default_factory=dict)


@dataclass(frozen=True)
class SLO:
    ttft_s: float = 2.0  # target P95 time to first token
    tpot_s: float = 0.2  # target mean time per output token


@dataclass(frozen=True)
class ClusterView:
    """Everything a planner sees at one tick."""

    now: float
    nodes: tuple[NodeState, ...]
    mode: PlannerMode = PlannerMode.AUTO
    pin: Pin | None = None
    slo: SLO = SLO()
    last_switch_t: float | None = None
    # Requests received since the gateway started, cumulative: every request
    # that arrived (queued or running ones included) and those refused at
    # admission (rate limits). None: not counted (the planner then takes the
    # rate of finished requests, which cannot exceed what the split serves).
    requests_arrived: int | None = None
    requests_rejected: int | None = None


@dataclass(frozen=True)
class SwitchAction:
    node_id: str
    to_phase: Phase


@dataclass(frozen=True)
class SplitPrediction:
    prefill_nodes: int
    decode_nodes: int
    throughput_rps: float  # of the offered load: what this split would serve of it
    throughput_lo_rps: float  # lower confidence bound
    throughput_hi_rps: float
    tokens_per_s: float  # at capacity
    ttft_s: float
    tpot_s: float
    feasible: bool  # meets SLOs and KV capacity
    switch_cost_s: float  # node-seconds of capacity lost to move here
    capacity_rps: float = 0.0  # the most requests/s it sustains under the current mix
    response_s: float = 0.0  # mean response time at throughput_rps


@dataclass(frozen=True)
class Decision:
    """One planner tick's outcome; persisted whether acted on or not."""

    t: float
    planner: str
    current_split: tuple[int, int]
    chosen_split: tuple[int, int]
    actions: tuple[SwitchAction, ...]
    acted: bool
    reason: str
    confidence: float = 0.0
    predictions: tuple[SplitPrediction, ...] = ()
    inputs: dict[str, float] = field(default_factory=dict)


class Planner(Protocol):
    """A planner strategy. Pure: no I/O, no clock reads, no randomness.

    Call order per tick: `observe_iterations` and `observe_requests` with the
    records gathered since the last tick (possibly empty), then `decide` once.
    `decide` returns actions only when the view's mode is AUTO and no pin
    forbids them; in other modes it still returns the Decision it would have
    taken, with `acted=False`.
    """

    name: str

    def observe_iterations(self, records: list[IterationRecord]) -> None: ...

    def observe_requests(self, samples: list[RequestSample]) -> None: ...

    def decide(self, view: ClusterView) -> Decision: ...
