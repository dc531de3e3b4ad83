"""Gateway settings: one frozen object, read once at startup.

Only `GatewaySettings.from_env` reads the environment (prefix `EVOLVING_`);
everything else receives the object. Every field is validated in
`__post_init__` so a bad value fails at startup, not on the first request.

Environment variables (all optional):

    EVOLVING_MODEL_DIR            model folder with the HF tokenizer (required to serve)
    EVOLVING_MODEL_NAME           id served on /v1/models (default: folder name)
    EVOLVING_WORKER_URLS          comma-separated worker base URLs
    EVOLVING_HOST / EVOLVING_PORT listen address (127.0.0.1:8000)
    EVOLVING_MAX_BODY_BYTES       request body limit (4 MiB)
    EVOLVING_ADMIN_MAX_BODY_BYTES request body limit of the admin API (1 MiB)
    EVOLVING_MAX_PROMPT_TOKENS    longest prompt accepted, in tokens (default: the model's
                                  context length from its config.json; set it to the
                                  workers' --max-model-len to refuse earlier)
    EVOLVING_TOKENIZE_PROCESS     lazy | warm | off: prompts of EVOLVING_TOKENIZE_PROCESS_CHARS
                                  (262144) characters or more tokenized in a process of
                                  their own, started at the first one (lazy) or with the app
    EVOLVING_BLOCK_SIZE           KV block size in tokens (32), same as the workers
    EVOLVING_BRANCH_TTL_S         idle time before an unfinished branch expires (1800)
    EVOLVING_HEARTBEAT_S          worker stats polling interval (0.5)
    EVOLVING_DRAIN_S              seconds open streams get to finish after SIGTERM/Ctrl-C before
                                  they end with a `gateway_shutting_down` error event (30)
    EVOLVING_LOCAL_PREFILL_MAX    uncached tokens run on the decode node (256)
    EVOLVING_SWITCH_DEADLINE_S    decodes get this long before migration (0 = migrate now)
    EVOLVING_DEFAULT_MAX_TOKENS   upper bound of max_tokens when a request sets none (unset: what
                                  the context leaves after the prompt)
    EVOLVING_MODEL_ALIASES        other names clients may use for the served model, comma-separated
                                  (e.g. gpt-5.6-luna,claude-sonnet-4-5; * accepts any name)
    EVOLVING_TOOL_CALL_PARSER     vLLM tool-call parser reading tool calls from the output (hermes;
                                  none: tools are only shown to the model, tool_choice is refused)
    EVOLVING_REASONING_PARSER     vLLM reasoning parser splitting reasoning from content (none)
    EVOLVING_TOOL_STRICT_LEVEL    auto | function | parameter: how far tool calls are constrained
                                  (vLLM's --tool-strict-level; parameter: arguments always follow
                                  their schema, not only for `strict` tools) (auto)
    EVOLVING_RESPONSES_TTL_S      how long a stored Responses API response can be continued with
                                  previous_response_id (86400)
    EVOLVING_RESPONSES_MAX        stored responses kept per gateway replica in memory (10000;
                                  in Redis with EVOLVING_DIRECTORY_URL, bounded by the TTL only)
    EVOLVING_DIRECTORY_URL        Redis URL of the state gateway replicas share: KV directory, tenant
                                  limits, overrides bus, workload stream (in memory when unset;
                                  required with more than one gateway process)
    EVOLVING_REDIS_PREFIX         namespace of every Redis key this cluster uses (evolving)
    EVOLVING_REPLICA_ID           this gateway process' name in leadership and membership
                                  (default: <hostname>-<pid>)
    EVOLVING_GATEWAY_REPLICAS     gateway processes the cluster runs (1); with Redis unreachable
                                  and no membership seen yet, each enforces limit / this
    EVOLVING_LEADER_TTL_S         planner leadership lease, s (2.0): a dead leader is replaced
                                  within about TTL + renew interval
    EVOLVING_LEADER_RENEW_S       lease renewal / takeover attempt interval, s (0.5)
    EVOLVING_RECONCILE_S          keys, policies and overrides re-read from the store, s (2.0):
                                  heals a missed change notice
    EVOLVING_CLUSTER_TOKEN        bearer token for the workers' /internal API
    EVOLVING_DB_URL               SQLAlchemy URL of the control-plane store (default: SQLite
                                  file evolving.db in the data folder)
    EVOLVING_DATA_DIR             data folder: SQLite store, demo API key, logs (data)
    EVOLVING_AUTH                 keys (tenant API keys and policies from the store; default)
                                  or open (one tenant, no key, no limits: local hacking only)
    EVOLVING_ADMIN_TOKEN          operator token of the admin API, imported at start (>= 16 chars)
    EVOLVING_SECRET_PEPPER        server-side secret mixed into key/token hashes; keep it stable
    EVOLVING_PLANNER              evolving | dynamo | static | none (evolving)
    EVOLVING_PLANNER_MODE         auto | advisory | manual at start, unless an operator's choice
                                  is persisted in the store (advisory)
    EVOLVING_PLANNER_INTERVAL_S   seconds between planner ticks (1.0)
    EVOLVING_PLANNER_MIN_PREFILL  fewest prefill nodes the evolving planner keeps (0: with none,
                                  decode nodes compute every prompt, as the router does)

Traces (the standard OpenTelemetry names, `core.tracing.TraceSettings`): off unless
OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT names a collector
(OTLP over HTTP); OTEL_TRACES_SAMPLER_ARG is the share of requests traced (1.0).
"""

from __future__ import annotations

import os
import pathlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.tracing import TraceSettings

AUTH_MODES = ("keys", "open")
PLANNERS = ("evolving", "dynamo", "static", "none")
PLANNER_MODES = ("auto", "advisory", "manual")


@dataclass(frozen=True)
class GatewaySettings:
    model_dir: str | None = None
    model_name: str = ""  # empty: derived from model_dir
    worker_urls: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 4 * 1024 * 1024
    admin_max_body_bytes: int = 1024 * 1024
    # None: the model's context length (config.json), when the tokenizer folder has one.
    max_prompt_tokens: int | None = None
    # Prompts of `tokenize_process_chars` characters or more are tokenized in
    # a process of its own (gateway/serving/tokenize_process.py): "lazy"
    # starts it at the first such prompt, "warm" with the app, "off" keeps
    # them in a thread, where they stall the loop through the GIL.
    tokenize_process: str = "lazy"
    tokenize_process_chars: int = 256 * 1024
    block_size: int = 32  # must equal the workers' --block-size (their default is 32)
    branch_ttl_s: float = 1800.0
    heartbeat_interval_s: float = 0.5
    # After SIGTERM/SIGINT: no new connections; open streams get this long to finish.
    drain_s: float = 30.0
    # A worker that misses this many consecutive heartbeats is unhealthy.
    heartbeat_failures: int = 3
    local_prefill_max_tokens: int = 256
    switch_deadline_s: float = 0.0
    # Attempts per request across nodes (prefill retries + decode resumes).
    max_node_attempts: int = 4
    # A request under way with no node to continue on waits this long for one (engines restarting).
    resume_wait_s: float = 60.0
    # Upper bound of max_tokens when a request names none; None: what the
    # context leaves after the prompt (OpenAI's default).
    default_max_tokens: int | None = None
    # Other names of the served model (the OpenAI Agents SDK sends its own
    # default model name); "*" accepts any name.
    model_aliases: tuple[str, ...] = ()
    tool_call_parser: str | None = "hermes"
    reasoning_parser: str | None = None
    tool_strict_level: str = "auto"
    responses_ttl_s: float = 86400.0
    responses_max: int = 10_000
    # Requests kept in the in-memory request log (GET /admin/requests), newest first out.
    request_log_size: int = 10_000
    # Upper bound for one worker call to connect / between two stream chunks.
    connect_timeout_s: float = 5.0
    stream_idle_timeout_s: float = 300.0
    max_connections: int = 1024
    db_url: str | None = None
    # Redis URL of the state replicas share (directory, limits, bus, workload); None: in memory.
    directory_url: str | None = None
    redis_prefix: str = "evolving"
    replica_id: str = ""  # empty: <hostname>-<pid> (see `replica`)
    gateway_replicas: int = 1
    leader_ttl_s: float = 2.0
    leader_renew_s: float = 0.5
    reconcile_s: float = 2.0
    # Bearer token the workers require on /internal (their --cluster-token).
    cluster_token: str | None = None
    # Control plane (gateway.compose). Secrets stay out of repr().
    data_dir: str = "data"
    auth: str = "keys"  # AUTH_MODES
    admin_token: str | None = field(default=None, repr=False)
    secret_pepper: str = field(default="", repr=False)
    planner: str = "evolving"  # PLANNERS
    planner_mode: str = "advisory"  # PLANNER_MODES
    planner_interval_s: float = 1.0
    planner_min_prefill: int = 0
    # OpenTelemetry traces (OTEL_* environment names); off without an endpoint.
    tracing: TraceSettings = field(default_factory=TraceSettings)
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:  # noqa: C901 - a flat list of one check per field
        if not 1 <= self.port <= 65535:
            raise ValueError("port must be in 1..65535")
        if self.max_body_bytes < 1024 or self.admin_max_body_bytes < 1024:
            raise ValueError("max_body_bytes and admin_max_body_bytes must be >= 1024")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError("max_prompt_tokens must be >= 1")
        if self.tokenize_process not in ("lazy", "warm", "off"):
            raise ValueError(f"tokenize_process must be lazy, warm or off, not {self.tokenize_process!r}")
        if self.tokenize_process_chars < 1:
            raise ValueError("tokenize_process_chars must be >= 1")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.heartbeat_interval_s <= 0 or self.heartbeat_failures < 1:
            raise ValueError("heartbeat interval must be > 0 and failures >= 1")
        if self.branch_ttl_s <= 0:
            raise ValueError("branch_ttl_s must be > 0")
        if self.drain_s < 0:
            raise ValueError("drain_s must be >= 0")
        if self.local_prefill_max_tokens < 0 or self.switch_deadline_s < 0:
            raise ValueError("local_prefill_max_tokens and switch_deadline_s must be >= 0")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if self.tool_strict_level not in ("auto", "function", "parameter"):
            raise ValueError("tool_strict_level must be auto, function or parameter")
        if self.responses_ttl_s <= 0 or self.responses_max < 1:
            raise ValueError("responses_ttl_s must be > 0 and responses_max >= 1")
        if self.request_log_size < 1:
            raise ValueError("request_log_size must be >= 1")
        if self.max_node_attempts < 1:
            raise ValueError("max_node_attempts must be >= 1")
        if self.resume_wait_s < 0:
            raise ValueError("resume_wait_s must be >= 0")
        if self.auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {AUTH_MODES}, not {self.auth!r}")
        if self.planner not in PLANNERS:
            raise ValueError(f"planner must be one of {PLANNERS}, not {self.planner!r}")
        if self.planner_mode not in PLANNER_MODES:
            raise ValueError(f"planner_mode must be one of {PLANNER_MODES}, not {self.planner_mode!r}")
        if self.planner_interval_s <= 0:
            raise ValueError("planner_interval_s must be > 0")
        if not 0 < self.leader_renew_s <= self.leader_ttl_s / 2:
            raise ValueError("leader_renew_s must be > 0 and at most half of leader_ttl_s")
        if self.gateway_replicas < 1 or self.reconcile_s <= 0:
            raise ValueError("gateway_replicas must be >= 1 and reconcile_s > 0")
        if not self.redis_prefix or any(c in self.redis_prefix for c in "{}: "):
            raise ValueError("redis_prefix must be non-empty, without braces, colons or spaces")
        if self.planner_min_prefill < 0:
            raise ValueError("planner_min_prefill must be >= 0")
        for url in self.worker_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker url must be http(s): {url!r}")

    @property
    def served_model(self) -> str:
        if self.model_name:
            return self.model_name
        if self.model_dir:
            return pathlib.Path(self.model_dir).name or "model"
        return "model"

    @property
    def replica(self) -> str:
        """This process' replica id: `replica_id`, else <hostname>-<pid> (unique per
        process, so `gateway --workers N` needs no setting)."""
        return self.replica_id or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def redis_base(self) -> str:
        """Prefix of every Redis key: the namespace as a hash tag (`{evolving}`), so a
        Redis Cluster keeps the keys one script touches in one slot."""
        return "{" + self.redis_prefix + "}"

    @property
    def store_url(self) -> str:
        """`db_url`, or the embedded SQLite file in the data folder."""
        if self.db_url:
            return self.db_url
        return f"sqlite:///{(pathlib.Path(self.data_dir) / 'evolving.db').resolve()}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> GatewaySettings:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(f"EVOLVING_{name}")
            return value if value not in (None, "") else None

        values: dict[str, Any] = {}  # field name: value, checked by the constructor
        casts: dict[str, tuple[str, type]] = {
            "MODEL_DIR": ("model_dir", str),
            "MODEL_NAME": ("model_name", str),
            "HOST": ("host", str),
            "PORT": ("port", int),
            "MAX_BODY_BYTES": ("max_body_bytes", int),
            "ADMIN_MAX_BODY_BYTES": ("admin_max_body_bytes", int),
            "MAX_PROMPT_TOKENS": ("max_prompt_tokens", int),
            "TOKENIZE_PROCESS": ("tokenize_process", str),
            "TOKENIZE_PROCESS_CHARS": ("tokenize_process_chars", int),
            "BLOCK_SIZE": ("block_size", int),
            "BRANCH_TTL_S": ("branch_ttl_s", float),
            "HEARTBEAT_S": ("heartbeat_interval_s", float),
            "DRAIN_S": ("drain_s", float),
            "RESUME_WAIT_S": ("resume_wait_s", float),
            "LOCAL_PREFILL_MAX": ("local_prefill_max_tokens", int),
            "SWITCH_DEADLINE_S": ("switch_deadline_s", float),
            "DB_URL": ("db_url", str),
            "DIRECTORY_URL": ("directory_url", str),
            "REDIS_PREFIX": ("redis_prefix", str),
            "REPLICA_ID": ("replica_id", str),
            "GATEWAY_REPLICAS": ("gateway_replicas", int),
            "LEADER_TTL_S": ("leader_ttl_s", float),
            "LEADER_RENEW_S": ("leader_renew_s", float),
            "RECONCILE_S": ("reconcile_s", float),
            "CLUSTER_TOKEN": ("cluster_token", str),
            "DEFAULT_MAX_TOKENS": ("default_max_tokens", int),
            "DATA_DIR": ("data_dir", str),
            "AUTH": ("auth", str),
            "ADMIN_TOKEN": ("admin_token", str),
            "SECRET_PEPPER": ("secret_pepper", str),
            "PLANNER": ("planner", str),
            "PLANNER_MODE": ("planner_mode", str),
            "PLANNER_INTERVAL_S": ("planner_interval_s", float),
            "TOOL_STRICT_LEVEL": ("tool_strict_level", str),
            "RESPONSES_TTL_S": ("responses_ttl_s", float),
            "RESPONSES_MAX": ("responses_max", int),
            "REQUEST_LOG_SIZE": ("request_log_size", int),
            "PLANNER_MIN_PREFILL": ("planner_min_prefill", int),
        }
        for env_name, (attr, cast) in casts.items():
            raw = get(env_name)
            if raw is not None:
                values[attr] = cast(raw)
        for env_name, attr in (("TOOL_CALL_PARSER", "tool_call_parser"), ("REASONING_PARSER", "reasoning_parser")):
            raw = get(env_name)
            if raw is not None:
                values[attr] = None if raw.lower() == "none" else raw
        aliases = get("MODEL_ALIASES")
        if aliases:
            values["model_aliases"] = tuple(a.strip() for a in aliases.split(",") if a.strip())
        urls = get("WORKER_URLS")
        if urls:
            values["worker_urls"] = tuple(u.strip().rstrip("/") for u in urls.split(",") if u.strip())
        values["tracing"] = TraceSettings.from_otel_env(env)
        values.update(overrides)
        return cls(**values)
