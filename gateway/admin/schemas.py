"""Pydantic schemas of the admin API (separate from the store's tables)."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from core import Phase
from gateway.control.ports import NodeSnapshot
from gateway.kv.views import BranchSummary, DirectoryStatus
from gateway.store.records import MAX_PRIORITY, Policy

# Policy numbers fit a signed 64-bit column; larger ones are client errors, not 500s.
MAX_POLICY_INT = 2**62

T = TypeVar("T")
Mode = Literal["auto", "advisory", "manual"]
# What an admin token may do (gateway.admin.auth): a viewer reads, an operator
# also changes things. The wire field keeps its name, `role`.
AccessLevel = Literal["viewer", "operator"]


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int


class WhoAmI(BaseModel):
    name: str
    role: AccessLevel


# -- cluster -----------------------------------------------------------------


class ClusterOut(BaseModel):
    nodes: list[NodeSnapshot]
    split: tuple[int, int] = Field(description="(prefill nodes, decode nodes)")
    split_pin: int | None
    directory: DirectoryStatus
    top_branches: list[BranchSummary]


class HistoryPoint(BaseModel):
    t: float
    prefill: int
    decode: int
    tokens_per_s: float


class HistoryOut(BaseModel):
    items: list[HistoryPoint]


class ActionOut(BaseModel):
    node_id: str
    to_phase: Phase


class LastDecisionOut(BaseModel):
    t: float
    planner: str
    current_split: tuple[int, int]
    chosen_split: tuple[int, int]
    acted: bool
    reason: str
    confidence: float
    actions: list[ActionOut]
    inputs: dict[str, float] = Field(default_factory=dict, description="workload and model figures it decided on")


class PredictionOut(BaseModel):
    prefill_nodes: int
    decode_nodes: int
    throughput_rps: float = Field(description="requests/s this split would serve of the offered load")
    throughput_lo_rps: float
    throughput_hi_rps: float
    tokens_per_s: float
    ttft_s: float
    tpot_s: float
    feasible: bool
    switch_cost_s: float
    capacity_rps: float = Field(0.0, description="the most requests/s it sustains under the current mix")
    response_s: float = Field(0.0, description="mean response time at throughput_rps")


class LeadershipOut(BaseModel):
    replica: str = Field(description="the gateway replica that answered")
    leader: str | None = Field(description="the replica whose planner acts; null while none holds the lease")
    term: int = Field(description="the newest leadership term this replica knows (workers fence orders by it)")
    leading: bool = Field(description="the answering replica is the leader")
    store_reachable: bool


class PlannerOut(BaseModel):
    mode: Mode
    planner: str
    last_decision: LastDecisionOut | None = Field(
        description="the latest decision of the leader (on a follower: read from the store)"
    )
    # The newest prediction per split, made at `predictions_t` (unix s): older than
    # `last_decision` while the planner holds for lack of data.
    predictions: list[PredictionOut]
    predictions_t: float | None = None
    leadership: LeadershipOut | None = Field(None, description="null: one gateway without an election")


class PlannerModeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Mode


class PinsOut(BaseModel):
    split: int | None = Field(description="pinned number of prefill nodes")
    nodes: dict[str, Phase] = Field(description="node_id -> pinned phase")


class SplitPinIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefill_nodes: int = Field(ge=0, le=1_000_000)


class NodePinIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    phase: Phase


class SwitchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_id: str = Field(min_length=1)
    to_phase: Phase
    reason: str = Field(default="manual", max_length=1000)


class SwitchOut(BaseModel):
    node_id: str
    from_phase: Phase
    to_phase: Phase
    drain_s: float
    migrate_s: float
    total_s: float
    outcome: str
    detail: str


class SwitchEventOut(SwitchOut):
    model_config = ConfigDict(from_attributes=True)
    id: int
    t: float
    reason: str
    who: str


class DecisionOut(BaseModel):
    id: int
    t: float
    planner: str
    mode: str
    current_split: tuple[int, int]
    chosen_split: tuple[int, int]
    acted: bool
    confidence: float
    reason: str
    inputs: dict[str, Any] | None
    predictions: list[dict[str, Any]] | None
    actions: list[dict[str, Any]] | None
    predicted_gain: float | None = Field(
        default=None, description="A model move's predicted gain (fraction of throughput, or of response time)"
    )
    realized_gain: float | None = Field(
        default=None, description="What the move delivered once settled, on the decision that checked it"
    )


# -- tenants -----------------------------------------------------------------


class PolicyBody(BaseModel):
    """A tenant policy. Null limits mean unlimited; null `allowed_models` means all."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(default=None, ge=1, le=MAX_POLICY_INT)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=MAX_POLICY_INT, description="prompt + max_tokens")
    max_concurrent: int | None = Field(default=None, ge=1, le=MAX_POLICY_INT)
    priority: int = Field(default=1, ge=0, le=MAX_PRIORITY, description="0 = admitted first under load")
    allowed_models: list[str] | None = Field(default=None, max_length=1000)
    max_active_branches: int | None = Field(default=None, ge=1, le=MAX_POLICY_INT)
    kv_retention_blocks: int | None = Field(default=None, ge=0, le=MAX_POLICY_INT)
    cache_isolation: bool = Field(default=True, description="tenant salt in KV block hashes")

    @field_validator("allowed_models")
    @classmethod
    def _models(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if any(not m.strip() for m in value):
                raise ValueError("model names must be non-empty")
            if len(set(value)) != len(value):
                raise ValueError("model names must not repeat")
        return value

    def to_policy(self) -> Policy:
        data = self.model_dump()
        if data["allowed_models"] is not None:
            data["allowed_models"] = tuple(data["allowed_models"])
        return Policy(**data)

    @classmethod
    def of(cls, policy: Policy) -> PolicyBody:
        return cls(
            **{
                **policy.__dict__,
                "allowed_models": None if policy.allowed_models is None else list(policy.allowed_models),
            }
        )


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    id: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    policy: PolicyBody | None = None


class TenantPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)


class TenantOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    created_at: float


class ApiKeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=200)


class ApiKeyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    prefix: str
    created_at: float
    revoked_at: float | None


class ApiKeyCreated(BaseModel):
    id: str
    name: str
    prefix: str
    secret: str = Field(description="shown once; only a hash is stored")


class UsageRow(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    minute: int = Field(description="unix seconds at the start of the minute")
    model: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class AuditOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    t: float
    actor: str  # the admin token's name, or "system"
    actor_id: str | None = None  # the admin token's id ("system"; None on rows older than this field)
    action: str
    target: str
    before: Any
    after: Any


# -- admin tokens ------------------------------------------------------------


class AdminTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    role: AccessLevel


class AdminTokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    role: AccessLevel
    prefix: str
    created_at: float
    revoked_at: float | None


class AdminTokenCreated(BaseModel):
    id: str
    name: str
    role: AccessLevel
    prefix: str
    secret: str = Field(description="shown once; only a hash is stored")
