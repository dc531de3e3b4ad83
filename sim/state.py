"""Per-request simulation state and the node-side configuration.

`SimRequest` is mutable and owned by the cluster; nodes update the fields the
contract below names. Times are simulation seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sim.workloads import Request

# An `IterationRecord`'s fields as a plain tuple: engines log one per
# iteration (segment), the cluster builds records only for those it hands on.
RawRecord = tuple[Any, ...]


class IterationModel(Protocol):
    """What a node needs from a profile: iteration times in ms.

    Both must be non-negative and non-decreasing in every argument; the
    simulator assumes decode time is linear in `context_tokens` (it sums runs
    of decode iterations in closed form).
    """

    def predict_prefill_ms(
        self, uncached_tokens: float, cached_tokens: float, pair_tokens: float | None = None
    ) -> float:
        """Batch totals of uncached and cached tokens; `pair_tokens`: Σ over
        its requests of uncached·(uncached + cached), each request's new
        tokens attending to its own context (None: one request)."""

    def predict_decode_ms(self, batch_size: float, context_tokens: float) -> float: ...


@dataclass(frozen=True)
class NodeConfig:
    chunk_tokens: int = 8_192  # chunked-prefill token budget per iteration
    max_batch: int = 256  # max running decode sequences
    kv_capacity_tokens: int = 2_000_000  # device KV, tokens
    kv_bytes_per_token: int = 180_000
    pool_gbps: float = 50.0  # KV pulled from peers' host memory, GB/s per node
    d2h_gbps: float = 100.0  # device -> own host store (migration save), GB/s
    layerwise_kv: bool = False  # True: KV loads during the prefill iteration (stall)
    switch_overhead_s: float = 1.0  # in-place role flip (engine reconfigure)
    # Latencies beside compute (0 in the GPU scenarios; `simulate --fidelity` measures them on the live
    # demo cluster). None of them holds a node busy.
    handoff_s: float = 0.0  # prefill's token visible -> decode engine has the request (gateway round trip)
    prefill_answer_s: float = 0.0  # prefill done -> its token reaches the client, beyond a streamed token's path
    engine_in_s: float = 0.0  # a request reaches the engine -> it can be scheduled (input processing)
    engine_out_s: float = 0.0  # an iteration ends -> its tokens leave the engine (output processing)
    pull_latency_s: float = 0.0  # fixed cost of a decode node pulling KV from a peer, beside its bytes
    prefill_pull_latency_s: float = 0.0  # ...of a prefill node pulling its prompt's cached prefix
    stream_lag_s: float = 0.0  # a stream's last token reaches the client this much later than a first token would

    def __post_init__(self) -> None:
        if self.chunk_tokens <= 0 or self.max_batch <= 0 or self.kv_capacity_tokens <= 0:
            raise ValueError("chunk_tokens, max_batch and kv_capacity_tokens must be > 0")
        if self.pool_gbps <= 0 or self.d2h_gbps <= 0:
            raise ValueError("bandwidths must be > 0")
        if (
            min(
                self.handoff_s,
                self.prefill_answer_s,
                self.engine_in_s,
                self.engine_out_s,
                self.pull_latency_s,
                self.prefill_pull_latency_s,
                self.stream_lag_s,
            )
            < 0
        ):
            raise ValueError("latencies must be >= 0")

    def pool_s(self, tokens: int, *, prefill: bool = False) -> float:
        """A decode (`prefill`: a prefill) node pulling `tokens` of KV from
        peers (0 tokens: no pull, no latency)."""
        if tokens <= 0:
            return 0.0
        latency = self.prefill_pull_latency_s if prefill else self.pull_latency_s
        return latency + tokens * self.kv_bytes_per_token / (self.pool_gbps * 1e9)

    def d2h_s(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / (self.d2h_gbps * 1e9)


@dataclass(eq=False, slots=True)
class SimRequest:
    req: Request
    arrival: float
    cached: int = 0  # prefix tokens served from cache for the prompt computation
    first_token: float | None = None
    finish: float | None = None
    generated: int = 0  # tokens generated before joining the current decode node
    ready_at: float = 0.0  # KV for the next stage available from this time
    stall_s: float = 0.0  # layerwise: transfer time that lands in the first prefill chunk
    local_prefill: bool = False  # the decode node computes the prompt itself
    decode_node: str = ""
    prefill_node: str = ""
    decode_cached: int = 0  # prompt tokens the decode node already holds
    finish_step: int = 0  # decode node step count at which the request is done
    join_step: int = 0
    migrations: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def context(self) -> int:
        return self.req.prompt_tokens + self.generated
