"""Plain records that cross the store's boundary (no SQLAlchemy objects).

`Policy` is the per-tenant policy the gateway enforces; it validates itself
so that an invalid policy can be neither stored nor enforced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core import Phase

MAX_PRIORITY = 3  # priority classes 0 (highest) .. 3 (lowest)
DEFAULT_PRIORITY = 1


@dataclass(frozen=True)
class Policy:
    """Per-tenant limits. `None` means unlimited (or, for models, all models)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + max_tokens, estimated at admission
    max_concurrent: int | None = None
    priority: int = DEFAULT_PRIORITY  # admission order when the cluster is saturated
    allowed_models: tuple[str, ...] | None = None
    max_active_branches: int | None = None
    kv_retention_blocks: int | None = None  # blocks its active branches may pin
    cache_isolation: bool = True  # tenant salt in the block hash

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "max_concurrent", "max_active_branches"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or null")
        if self.kv_retention_blocks is not None and (
            not isinstance(self.kv_retention_blocks, int) or self.kv_retention_blocks < 0
        ):
            raise ValueError("kv_retention_blocks must be a non-negative integer or null")
        if not isinstance(self.priority, int) or not 0 <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be an integer in 0..{MAX_PRIORITY}")
        if self.allowed_models is not None:
            if any(not isinstance(m, str) or not m for m in self.allowed_models):
                raise ValueError("allowed_models must be non-empty strings")
            if len(set(self.allowed_models)) != len(self.allowed_models):
                raise ValueError("allowed_models must not repeat a model")

    def allows_model(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


@dataclass(frozen=True)
class KeyGrant:
    """One active API key with what it grants: enough to authenticate offline."""

    key_id: str
    prefix: str
    salt: str
    secret_hash: str
    tenant_id: str
    tenant_name: str
    cache_salt: str
    policy: Policy


# Keys of the persisted overrides (table `overrides`).
SPLIT_PIN = "split_pin"
PLANNER_MODE = "planner_mode"
NODE_PIN_PREFIX = "node_pin:"


@dataclass(frozen=True)
class Overrides:
    """Operator pins and planner mode persisted across restarts."""

    split_pin: int | None = None
    node_pins: dict[str, str] = field(default_factory=dict)  # node_id -> phase
    planner_mode: str | None = None
    # override key -> version (unix time of the change), cleared keys included
    versions: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SwitchOutcome:
    node_id: str
    from_phase: Phase
    to_phase: Phase  # a restart record (cli.up) has both the phase the worker restarts in
    drain_s: float
    migrate_s: float
    total_s: float
    outcome: str  # "ok" | "failed" | "noop" | "fenced" (refused by the worker: a stale leadership term)
    detail: str = ""


@dataclass(frozen=True)
class UsageRecord:
    tenant_id: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class LeaseRecord:
    """The planner lease row as one claim left it (`gateway.control.lease`)."""

    holder: str  # "" when nobody ever held it
    term: int  # 0 before the first claim
    expires_in_s: float  # by the database's clock; <= 0: expired
