"""Wire models of the worker's internal API (gateway <-> worker).

The gateway is the only client. Every body is one of these models; the
streaming generate endpoint answers with newline-delimited JSON, one
`GenerateChunk` per line, the last one carrying `finish_reason`.

Endpoints (all under the worker's base URL):

    POST /internal/generate      GenerateRequest  -> GenerateChunk (json) or NDJSON stream
    POST /internal/abort         AbortRequest     -> AbortResponse
    POST /internal/migrate       MigrateRequest   -> MigrateResponse
    GET  /internal/phase                          -> PhaseStatus
    POST /internal/phase         PhaseChangeRequest -> PhaseChangeResult
    POST /internal/fence         FenceRequest     -> FenceStatus
    GET  /internal/stats?since=N                  -> WorkerStats
    GET  /internal/kv/agent                       -> KVAgentInfo   (NIXL metadata of this node)
    GET  /healthz                                 -> {"status": "ok", "engine": "alive"} or 503 engine_dead
    GET  /readyz                                  -> {"status": "ready"} or 503

Errors are `ErrorBody` with a 4xx/5xx status; `retryable` tells the gateway it
may send the same request to another node (wrong phase, draining, overload).

Engine health: the worker process can outlive its vLLM engine core. Its
state (`EngineState`) rides every heartbeat (`WorkerStats.engine`); a
request sent to a dead engine is refused with 503 `engine_dead`
(retryable); one whose engine dies under it gets 503 `engine_died`, or, once
streaming, an "error" chunk whose `error_type` is "engine_died" (the gateway
counts those toward quarantining a poison request).

Fencing (`workers.fence`): switch and migrate orders carry the sender's
leadership `term`; a worker refuses an order older than the newest term it
has seen with 409 and `type` "stale_term".
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core import FinishReason, Phase, Role
from core.ids import ID_RE

MAX_TOKENS_LIMIT = 1_000_000


class EngineState(str, Enum):
    """The vLLM engine core's state inside a worker process."""

    STARTING = "starting"  # loading; never alive yet
    ALIVE = "alive"
    DEAD = "dead"  # the core exited (crash, OOM kill); the process lives on without it
    RESTARTING = "restarting"  # a new core is starting in place of a dead one (workers.engine_heal)


# ErrorBody.type / GenerateChunk.error_type: the engine was dead before the
# request came (ENGINE_DEAD), or died while the request ran on it (ENGINE_DIED).
ENGINE_DEAD = "engine_dead"
ENGINE_DIED = "engine_died"
# ErrorBody.type: the node's phase does not take the request's role (it is
# switching, or the gateway's view of its phase is a heartbeat old).
WRONG_PHASE = "wrong_phase"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's top_logprobs bound)
MAX_LOGIT_BIAS = 1024  # tokens one request may bias


class StructuredOutput(_Model):
    """A constraint on the output, exactly one field set (vLLM's `StructuredOutputsParams`).

    `json_schema` is a JSON schema the output must validate against;
    `json_object` any JSON object; `structural_tag` an xgrammar structural
    tag as JSON text (tool calls: the gateway builds it with vLLM's tool
    parser). The worker compiles it with its structured-output backend and
    answers 400 when it cannot (an invalid schema or grammar).
    """

    json_schema: dict[str, Any] | None = None
    json_object: bool | None = None
    regex: str | None = Field(None, max_length=65_536)
    choice: list[str] | None = Field(None, min_length=1, max_length=1024)
    grammar: str | None = Field(None, max_length=262_144)
    structural_tag: str | None = Field(None, max_length=4_194_304)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutput:
        set_fields = [k for k, v in self if v not in (None, False)]
        if len(set_fields) != 1:
            raise ValueError(f"exactly one constraint must be set, not {set_fields or 'none'}")
        return self


class SamplingOptions(_Model):
    """What vLLM's `SamplingParams` gets, bounded as the OpenAI API bounds it.

    Stateless options (temperature, top_p/top_k/min_p, logit_bias, stop,
    ...) continue exactly when a request resumes on another node from
    prompt + generated tokens. Penalties and a structured output depend on
    everything generated so far (`resumable` is False): such a request is
    resumed by replaying it from its prompt (gateway.serving.segments).
    """

    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=1_000_000)  # 0 or -1: off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=16)
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    # token id -> bias added to its logit, in [-100, 100] (OpenAI's bounds)
    logit_bias: dict[Annotated[int, Field(ge=0)], Annotated[float, Field(ge=-100.0, le=100.0)]] = Field(
        default_factory=dict, max_length=MAX_LOGIT_BIAS
    )
    # None: no logprobs; k >= 0: the sampled token's logprob and the k most likely alternatives
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    structured_output: StructuredOutput | None = None

    @model_validator(mode="after")
    def _check(self) -> SamplingOptions:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self

    @property
    def resumable(self) -> bool:
        """Whether prompt + generated tokens continue the same distribution
        (no state that lives only inside the engine: penalties, a grammar)."""
        return (
            self.structured_output is None
            and self.presence_penalty == 0.0
            and self.frequency_penalty == 0.0
            and self.repetition_penalty == 1.0
        )


class BlockLocation(_Model):
    """One KV block in some node's host store.

    `block_hash` is the hex chained hash from `kvpool.hashing`; `slot` is the
    block's index in that node's host store region.
    """

    block_hash: str = Field(min_length=1, max_length=64)
    node_id: str = Field(min_length=1, max_length=128)
    slot: int = Field(ge=0)


class KVTransferSpec(_Model):
    """How the worker gets the prompt's cached prefix, resolved by the gateway.

    `load` lists, in prompt order, where each full block of the longest cached
    prefix lives (block i covers tokens [i*B, (i+1)*B)). The worker pulls
    them before it schedules the request (`mode="async"`, vLLM's
    WAITING_FOR_REMOTE_KVS) or layer by layer during the forward pass
    (`mode="layerwise"`). `save` asks the worker to save the prompt's new full
    blocks to its host store and report them.
    """

    load: list[BlockLocation] = Field(default_factory=list)
    # Base URLs of the nodes named in `load`, so the worker can fetch each
    # peer's NIXL agent metadata once (GET {url}/internal/kv/agent).
    peers: dict[str, str] = Field(default_factory=dict)
    mode: str = Field("async", pattern="^(async|layerwise)$")
    save: bool = True


class GenerateRequest(_Model):
    request_id: str
    prompt_token_ids: list[int] = Field(min_length=1)
    sampling: SamplingOptions = Field(default_factory=SamplingOptions)
    role: Role = Role.DECODE
    stream: bool = True
    tenant_salt: str = Field("", max_length=128)
    branch_id: str | None = Field(None, max_length=128)
    kv: KVTransferSpec | None = None
    # W3C Trace Context of the gateway's span for this call (a `traceparent` value):
    # the worker's spans join the request's trace. None: the request is not traced.
    traceparent: str | None = Field(None, max_length=128)

    @field_validator("request_id")
    @classmethod
    def _check_request_id(cls, v: str) -> str:
        if not ID_RE.match(v):
            raise ValueError("request_id must be 1-128 chars of [A-Za-z0-9._:-]")
        return v

    @field_validator("prompt_token_ids")
    @classmethod
    def _check_tokens(cls, v: list[int]) -> list[int]:
        if any(t < 0 for t in v):
            raise ValueError("token ids must be non-negative")
        return v


class TokenLogprobs(_Model):
    """Log-probabilities at one generated position: the sampled token's, and
    the `SamplingOptions.logprobs` most likely tokens (most likely first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = Field(default_factory=list)


class GenerateChunk(_Model):
    """One step of output. The final chunk has `finish_reason` set.

    finish_reason: "stop" | "length" | "abort" | "migrated" | "error".
    On "migrated", `saved_blocks` names where the request's KV (prompt and
    generated tokens, full blocks only) now lives, so the gateway can resume
    it elsewhere. `logprobs`, when asked for, has one entry per token in
    `token_ids`.
    """

    request_id: str
    token_ids: list[int] = Field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    external_cached_tokens: int = 0
    saved_blocks: list[BlockLocation] | None = None
    logprobs: list[TokenLogprobs] | None = None
    error: str | None = None
    error_type: str | None = None  # with finish_reason "error": ENGINE_DIED when the engine died under it


class AbortRequest(_Model):
    request_id: str


class AbortResponse(_Model):
    request_id: str
    aborted: bool


class MigrateRequest(_Model):
    """Stop the named in-flight decodes (all when empty) and save their KV."""

    request_ids: list[str] = Field(default_factory=list)
    # Leadership term of the sender (fencing); None counts as 0.
    term: int | None = Field(None, ge=0)


class MigrateResponse(_Model):
    migrated: list[str]


class PhaseStatus(_Model):
    node_id: str
    phase: Phase
    draining_to: Phase | None = None
    inflight_prefill: int = 0
    inflight_decode: int = 0


class PhaseChangeRequest(_Model):
    phase: Phase
    # In-flight decodes get this long to finish before they are migrated
    # (migrate=True) or aborted with finish_reason "abort" (migrate=False).
    deadline_s: float = Field(30.0, ge=0.0, le=3600.0)
    migrate: bool = True
    # Leadership term of the sender (fencing); None counts as 0.
    term: int | None = Field(None, ge=0)


class FenceRequest(_Model):
    """The newest leadership term the sender knows (a new leader announces itself)."""

    term: int = Field(ge=0)


class FenceStatus(_Model):
    node_id: str
    term: int  # newest term this worker has seen
    accepted_orders: int = 0
    refused_orders: int = 0  # orders refused as stale since the worker started


class PhaseChangeResult(_Model):
    node_id: str
    from_phase: Phase
    to_phase: Phase
    drain_s: float
    migrate_s: float
    total_s: float
    migrated: list[str] = Field(default_factory=list)


class IterationRecordWire(_Model):
    """One engine iteration, from vLLM's per-iteration scheduler details."""

    index: int
    t: float  # unix seconds at the end of the iteration
    phase: Phase
    batch_size: int
    uncached_prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    context_tokens: int
    elapsed_ms: float
    # Σ over the prefills of scheduled x (scheduled + computed) tokens (None: not reported)
    attention_pairs: int | None = None
    # the engine core's CPU share since the record before (workers.iterations; None: not measured)
    cpu_share: float | None = None
    # CPU µs of the host-speed probe, smoothed (workers.host_speed; None: not measured)
    host_probe_us: float | None = None


class RequestTimingWire(_Model):
    """When the engine produced a request's first and last tokens (vLLM's own
    request stats): what of a client's latency is the engine's, the rest
    being the gateway and HTTP path (the fidelity benchmark measures that
    part). Logged when the request ends."""

    index: int
    request_id: str
    role: Role
    t: float  # unix seconds when the worker saw the first token
    engine_ttft_s: float  # from the engine receiving the request to its first token
    # blocks of the cached prefix the gateway offered from peers' host stores
    # (pulled unless vLLM's device cache already holds them)
    peer_blocks: int = 0
    # from the engine receiving the request to its last output at the worker;
    # None when it stopped early (aborted, client gone). The record is logged
    # when the request ends.
    engine_e2e_s: float | None = None


class HostStoreStats(_Model):
    capacity_blocks: int = 0
    used_blocks: int = 0
    block_bytes: int = 0


class KVPeerStats(_Model):
    """This node's pulls from one peer since it started (its KV connector's view)."""

    peer: str
    state: str = "up"  # "down": pulls skip it (recompute) until it answers a probe again
    reason: str = ""  # why it last went down: timeout | unavailable | unreachable | http NNN | error
    pulls: dict[str, int] = Field(default_factory=dict)  # outcome -> count (kvpool.events.PULL_OUTCOMES)
    blocks: int = 0  # blocks pulled and verified
    pull_seconds: float = 0.0  # time in pulls that succeeded
    downs: int = 0  # times it went down


class WorkerStats(_Model):
    node_id: str
    phase: Phase
    draining_to: Phase | None = None
    num_running: int
    num_waiting: int
    kv_usage: float
    block_size: int
    max_model_len: int = 0  # the engine's context length (prompt + output tokens); 0: not reported
    tokens_per_s: float = 0.0
    # The engine's limits, for the planner (0: not reported).
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    kv_capacity_tokens: int = 0  # device KV, tokens
    host_store: HostStoreStats = Field(default_factory=HostStoreStats)
    iterations: list[IterationRecordWire] = Field(default_factory=list)
    # Blocks saved to / dropped from the host store since the last stats call;
    # the gateway publishes them to the directory.
    saved_blocks: list[BlockLocation] = Field(default_factory=list)
    dropped_blocks: list[BlockLocation] = Field(default_factory=list)
    kv_peers: list[KVPeerStats] = Field(default_factory=list)
    # Fencing: the newest leadership term seen and the orders refused as stale.
    fence_term: int = 0
    refused_orders: int = 0
    engine: EngineState = EngineState.ALIVE
    engine_error: str = ""  # why the engine died (empty while alive)
    started_at: float = 0.0  # when the worker process started (unix s; 0: not reported): a new value is a restart
    engine_restarts: int = 0  # engine cores this process restarted in place of dead ones (workers.engine_heal)


class KVAgentInfo(_Model):
    node_id: str
    agent_name: str
    metadata_b64: str
    region_base: int
    block_bytes: int
    capacity_blocks: int


class ErrorBody(_Model):
    type: str
    message: str
    retryable: bool = False


class ErrorResponse(_Model):
    error: ErrorBody
