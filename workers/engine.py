"""The in-process vLLM engine of one worker, and the requests in flight on it.

`WorkerEngine` owns one `AsyncLLM` (its EngineCore runs in a child process,
as vLLM always does). It turns `GenerateRequest`s into vLLM calls and vLLM
outputs into `GenerateChunk`s, keeps the table of in-flight requests that
draining and migration act on, and never raises vLLM's own exceptions to the
HTTP layer: they become `EngineError`s with a clear message.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from core import FinishReason, Role
from kvpool.events import StepTimed
from workers import affinity
from workers.cpu_isa import resolve_dtype
from workers.iterations import IndexedLog, IterationLog, make_stat_logger_factory
from workers.kv_events import KVEventChannel
from workers.protocol import (
    ENGINE_DEAD,
    ENGINE_DIED,
    BlockLocation,
    EngineState,
    GenerateChunk,
    GenerateRequest,
    RequestTimingWire,
    StructuredOutput,
)
from workers.telemetry import WorkerTracing
from workers.vllm_fields import bound_tag_whitespace, token_logprobs

if TYPE_CHECKING:
    from vllm.config.model import ModelDType
    from vllm.config.structured_outputs import StructuredOutputsBackend
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM

STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance", "outlines")
YIELD_EVERY_S = 0.5  # longest this worker's streams keep other handlers (migrate, phase, stats) waiting
# How long an unfinished stream waits to learn whether its engine core died
# (only streams that end unfinished wait). Generous: on the loaded 2-core
# machine a poison request's first death went uncounted with 1 s (bench
# chaos); the gateway also counts a death its registry saw first.
DEATH_SETTLE_S = 3.0


@dataclass(frozen=True)
class EngineConfig:
    model: str
    node_id: str = "w0"
    block_size: int = 32  # vLLM's CPU attention needs a multiple of 32
    # Context length (prompt + output tokens); None: the model's own (config.json), as vLLM derives it.
    max_model_len: int | None = None
    # vLLM's `hf_overrides` (config.json fields), e.g. rope scaling to serve past the model's context.
    hf_overrides: dict[str, Any] | None = None
    # "auto": bfloat16 where the CPU has native bf16 (AVX512-BF16, AMX), else float32 (workers.cpu_isa).
    dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # chunked-prefill token budget per step
    kvcache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: device (paged) KV cache
    kv_store_gib: float = 0.25  # host block store shared through the KV pool
    kv_pool: bool = True  # load the KV connector (kvpool.connector.pool)
    kv_pull_timeout_s: float = 3.0  # deadline of one pull from a peer (> 0); then the blocks are recomputed
    threads_bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND, e.g. "0" or "1"
    http_cpus: str | None = None  # this process's own threads: None, "auto" or a CPU list (workers/affinity.py)
    enforce_eager: bool = True  # faster start on CPU; compile cache helps later
    # "uni": the engine-core process runs the model itself. "mp": vLLM-CPU's
    # default, a separate model process whose shared-memory reader busy-polls
    # a core between steps, starving the HTTP side and the gateway on small
    # hosts (docs/operations.md, docs/benchmarks.md).
    executor: str = "uni"
    run_dir: str = "data/run"
    # vLLM's structured-output backend ("auto" picks xgrammar where it can).
    structured_outputs_backend: str = "auto"
    # JSON constraints allow no free whitespace (compact JSON). A model that
    # writes whitespace freely inside a grammar (the random demo model) may
    # otherwise never close its JSON. vLLM supports it on xgrammar and
    # guidance only, so "auto" means xgrammar then.
    json_no_whitespace: bool = False
    # False: vLLM's stock CPU sampler, whose seeded requests with a chunked
    # prefill kill the engine (workers/seeded_cpu.py). Only `bench chaos`
    # turns it off, to have a real poison request.
    seeded_cpu_sampler: bool = True
    # vLLM's own request tracing (its `otlp_traces_endpoint`): its span per request joins
    # the gateway's trace. vLLM then traces every request it finishes, sampled or not.
    otlp_traces_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size % 32:
            raise ValueError("block_size must be a positive multiple of 32")
        if self.max_model_len is not None and self.max_model_len < self.block_size:
            raise ValueError("max_model_len must be >= block_size")
        if self.kv_pull_timeout_s <= 0:
            raise ValueError("kv_pull_timeout_s must be > 0")
        if self.kvcache_gib < 1:
            raise ValueError("kvcache_gib must be >= 1 (vLLM-CPU takes whole GiB)")
        if self.executor not in ("uni", "mp"):
            raise ValueError("executor must be 'uni' or 'mp'")
        if self.structured_outputs_backend not in STRUCTURED_OUTPUT_BACKENDS:
            raise ValueError(f"structured_outputs_backend must be one of {STRUCTURED_OUTPUT_BACKENDS}")
        if self.json_no_whitespace and self.structured_outputs_backend == "outlines":
            raise ValueError("json_no_whitespace needs structured_outputs_backend xgrammar or guidance")
        if self.http_cpus not in (None, "none", "auto"):
            affinity.parse_cpu_list(self.http_cpus)  # raises ValueError with the reason


class EngineError(Exception):
    """A request the engine cannot serve (bad input or engine failure).

    `kind` is the error body's type: "invalid_request", or
    "invalid_structured_output" when the request's constraint (JSON schema,
    grammar, structural tag) is what vLLM refused."""

    def __init__(
        self, message: str, *, status: int = 400, retryable: bool = False, kind: str = "invalid_request"
    ) -> None:
        super().__init__(message)
        self.status, self.retryable, self.kind = status, retryable, kind


@dataclass
class Inflight:
    request_id: str
    role: Role
    prompt_tokens: int
    generated: int = 0
    migrate: bool = False  # set when the request is being migrated away
    finish: FinishReason | None = None  # how its last chunk ended it (None: it did not finish)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    first_token: dict | None = None  # the request's timing fields, logged when it ends


class WorkerEngine:
    def __init__(self, config: EngineConfig, phase_of, tracing: WorkerTracing | None = None) -> None:
        self.config = config
        self.tracing = tracing or WorkerTracing.off()
        self.iterations = IterationLog()
        self.request_timings = IndexedLog(RequestTimingWire)
        self.inflight: dict[str, Inflight] = {}
        self._phase_of = phase_of
        self._llm: AsyncLLM | None = None
        self.vocab_size = 0
        self.max_model_len = 0  # known once the engine is up
        self.kv_capacity_tokens = 0  # known once started
        self.kv_events: KVEventChannel | None = None
        self.started = False  # start() finished once (a later dead engine is not "starting")
        self.restarting = False  # a new engine core is starting in place of a dead one (restart)
        self.restarts = 0  # engine cores started in place of dead ones, in this process
        self._process_cpus: set[int] | None = None  # this process's CPUs before any pinning
        self._last_yield = 0.0  # loop time a stream last yielded (see generate)

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        if self._process_cpus is None:
            self._process_cpus = os.sched_getaffinity(0)
        else:
            # A restart: the first start may have moved this process's threads
            # off the engine's CPUs (`http_cpus`); the new core must get them.
            affinity.pin_own_threads(self._process_cpus)
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kvcache_gib)
        # The engine core is its own process either way (AsyncLLM); this only
        # stops vLLM-CPU from forcing the multiprocess executor.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if cfg.executor == "uni" else "1"
        if cfg.threads_bind:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cfg.threads_bind
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kv_transfer_config = None
        if cfg.kv_pool:
            run_dir = pathlib.Path(cfg.run_dir) / cfg.node_id
            run_dir.mkdir(parents=True, exist_ok=True)
            self.kv_events = KVEventChannel(
                str(run_dir / "kv-events.sock"), on_step=self._record_step, on_pull=self.tracing.pulled
            )
            await self.kv_events.start()
            kv_transfer_config = {
                "kv_connector": "PoolConnector",
                "kv_connector_module_path": "kvpool.connector.pool",
                "kv_role": "kv_both",
                "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {
                    "node_id": cfg.node_id,
                    "store_gib": cfg.kv_store_gib,
                    "run_dir": str(run_dir),
                    "events_socket": self.kv_events.path,
                    "pull_timeout_s": cfg.kv_pull_timeout_s,
                },
            }
        args = AsyncEngineArgs(
            model=cfg.model,
            dtype=cast("ModelDType", resolve_dtype(cfg.dtype)),  # vLLM's config validates the name
            block_size=cfg.block_size,
            # vLLM annotates it int; its own default is None too (the model's length).
            max_model_len=cfg.max_model_len,  # type: ignore[arg-type]
            hf_overrides=dict(cfg.hf_overrides or {}),
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            enforce_eager=cfg.enforce_eager,
            distributed_executor_backend=cfg.executor,
            enable_logging_iteration_details=True,
            disable_log_stats=False,
            # A dict: vLLM's pydantic config validates it into a KVTransferConfig.
            kv_transfer_config=kv_transfer_config,  # type: ignore[arg-type]
            # Seeded requests with a chunked prefill kill vLLM-CPU's own
            # worker (workers/seeded_cpu.py); elsewhere vLLM picks its own.
            # A restarted engine always gets the fixed sampler (the stock one is
            # for `bench chaos`'s first engines only, as if the fix rolled in).
            worker_cls="workers.seeded_cpu.SeededCPUWorker"
            if (cfg.seeded_cpu_sampler or self.restarts) and current_platform.is_cpu()
            else "auto",
            otlp_traces_endpoint=cfg.otlp_traces_endpoint,
            structured_outputs_config=StructuredOutputsConfig(
                backend=cast(  # vLLM's config validates the name
                    "StructuredOutputsBackend",
                    "xgrammar"
                    if cfg.json_no_whitespace and cfg.structured_outputs_backend == "auto"
                    else cfg.structured_outputs_backend,
                ),
                disable_any_whitespace=cfg.json_no_whitespace,
            ),
        )
        factory = make_stat_logger_factory(
            self.iterations, self._phase_of, self._context_tokens, records=self.kv_events is None
        )
        # "uni" has no vLLM thread binding (that lives in the multiprocess
        # executor): the engine-core process inherits the bind when spawned.
        bind = affinity.engine_cpus(cfg.threads_bind) if cfg.executor == "uni" else None

        def build() -> AsyncLLM:
            # The bind applies to the calling thread and what it spawns.
            with affinity.spawning_on(bind):  # ValueError if the bind names CPUs this process may not use
                return AsyncLLM.from_engine_args(args, stat_loggers=[factory])

        if self.started:
            # A restart: the model load (seconds to a minute) runs off the
            # event loop so this process keeps answering heartbeats and
            # /healthz meanwhile. vLLM starts its output handler on the
            # first request when it is built outside a running loop.
            self._llm = llm = await asyncio.to_thread(build)
        else:
            self._llm = llm = build()
        # The engine process is bound now; move this process's threads if asked.
        cpus = affinity.http_side_cpus(cfg.http_cpus, cfg.threads_bind, os.sched_getaffinity(0))
        if cpus:
            affinity.pin_own_threads(cpus)
        self.vocab_size = llm.model_config.get_vocab_size()
        # The context length the engine really serves (the model's own unless overridden).
        self.max_model_len = int(llm.model_config.max_model_len)
        # Device KV the engine core allocated (the client learns it at start-up).
        blocks = llm.vllm_config.cache_config.num_gpu_blocks or 0
        self.kv_capacity_tokens = int(blocks) * cfg.block_size
        self.started = True

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self.kv_events is not None:
            self.kv_events.close()

    async def restart(self) -> None:
        """A new engine core in place of a dead one, inside this process.

        The node keeps its id, port, phase, fence and logs; the KV event
        socket is made anew at the same path. The host store lived in the
        dead core (the connector's worker half), so the new one starts
        empty. Requests that ran on the dead core have already failed with
        `engine_died` (the healer waits for them); new ones are refused as
        `engine_dead` until the new core is up. Raises what `start` raises."""
        self.restarting = True
        try:
            await self.stop()
            self.restarts += 1
            await self.start()
        finally:
            self.restarting = False

    @property
    def ready(self) -> bool:
        """Loaded and its engine core alive (a dead core must not look ready)."""
        return self._llm is not None and not self._llm.errored

    @property
    def state(self) -> EngineState:
        if self.ready:
            return EngineState.ALIVE
        if self.restarting:
            return EngineState.RESTARTING
        return EngineState.DEAD if self.started else EngineState.STARTING

    @property
    def dead_reason(self) -> str:
        """Why the engine core is gone ("" while it is alive or starting)."""
        state = self.state
        if state is EngineState.RESTARTING:
            return f"the engine core died; a new one is starting in this process (restart {self.restarts + 1})"
        if state is not EngineState.DEAD:
            return ""
        if self._llm is None:
            return "the engine was stopped"
        # vLLM's own error says only "EngineCore encountered an issue"; the
        # core's traceback is in this worker's log.
        return "the engine core has stopped (its traceback is in the worker log)"

    async def _dead_soon(self, within_s: float = DEATH_SETTLE_S) -> bool:
        """The engine is, or within `within_s` turns out, not alive: a stream
        that ended unfinished or with an error may be told of its core's death
        a moment before the client marks itself errored."""
        deadline = time.monotonic() + within_s
        while self.state is EngineState.ALIVE:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def _live(self) -> AsyncLLM:
        """The engine, for callers that checked `ready` (EngineError if it went)."""
        if self._llm is None:
            raise self._engine_dead()
        return self._llm

    def _engine_dead(self, *, under_request: bool = False) -> EngineError:
        kind = ENGINE_DIED if under_request else ENGINE_DEAD
        return EngineError(self.dead_reason, status=503, retryable=True, kind=kind)

    def _record_step(self, ev: StepTimed) -> None:
        self.iterations.append(
            t=ev.t,
            phase=self._phase_of(),
            batch_size=ev.prefill_requests + ev.decode_requests,
            uncached_prompt_tokens=ev.uncached_prompt_tokens,
            cached_prompt_tokens=ev.cached_prompt_tokens,
            generated_tokens=ev.generated_tokens,
            context_tokens=ev.context_tokens,
            elapsed_ms=ev.elapsed_ms,
            attention_pairs=ev.attention_pairs,
        )

    def _context_tokens(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self.inflight.values() if r.role is Role.DECODE)

    def counts(self) -> tuple[int, int]:
        """(in-flight prefills, in-flight decodes)."""
        p = sum(1 for r in self.inflight.values() if r.role is Role.PREFILL)
        return p, len(self.inflight) - p

    # -- requests ----------------------------------------------------------
    def validate(self, req: GenerateRequest) -> None:
        s = req.sampling
        bad = [t for t in (*req.prompt_token_ids, *s.stop_token_ids, *s.logit_bias) if t >= self.vocab_size]
        if bad:
            raise EngineError(f"token id {bad[0]} is out of vocabulary (size {self.vocab_size})")
        max_tokens = 1 if req.role is Role.PREFILL else req.sampling.max_tokens
        if len(req.prompt_token_ids) + max_tokens > self.max_model_len:
            raise EngineError(
                f"prompt ({len(req.prompt_token_ids)} tokens) + max_tokens ({max_tokens}) "
                f"exceeds the model's context length {self.max_model_len}"
            )
        if req.request_id in self.inflight:
            raise EngineError(f"request {req.request_id} is already in flight", status=409)

    def _sampling_params(self, req: GenerateRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = req.sampling
        return SamplingParams(
            max_tokens=1 if req.role is Role.PREFILL else s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            seed=s.seed,
            stop=s.stop or None,
            stop_token_ids=s.stop_token_ids or None,
            ignore_eos=s.ignore_eos,
            min_tokens=min(s.min_tokens, 1) if req.role is Role.PREFILL else s.min_tokens,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            repetition_penalty=s.repetition_penalty,
            logit_bias=dict(s.logit_bias) or None,
            logprobs=s.logprobs,
            structured_outputs=self._structured_outputs(s.structured_output),
            output_kind=RequestOutputKind.DELTA,
            extra_args={"kv_transfer_params": self._kv_params(req)} if self.kv_events else None,
        )

    def _structured_outputs(self, spec: StructuredOutput | None):
        if spec is None:
            return None
        from vllm.sampling_params import StructuredOutputsParams

        tag = spec.structural_tag
        if tag is not None and self.config.json_no_whitespace:
            tag = bound_tag_whitespace(tag)
        return StructuredOutputsParams(
            json=spec.json_schema,
            json_object=spec.json_object,
            regex=spec.regex,
            choice=spec.choice,
            grammar=spec.grammar,
            structural_tag=tag,
        )

    def _kv_params(self, req: GenerateRequest) -> dict:
        kv = req.kv.model_dump() if req.kv else {"load": [], "mode": "async", "save": True}
        kv.update(rid=req.request_id, salt=req.tenant_salt)
        return kv

    async def generate(self, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Run one request; yields delta chunks, the last with finish_reason."""
        self._check_serving(req)
        from vllm.inputs import TokensPrompt

        params = self._sampling_params(req)
        state = Inflight(req.request_id, req.role, len(req.prompt_token_ids))
        self.inflight[req.request_id] = state
        finished = False
        span = self.tracing.start(req)  # None unless the gateway traces this call
        last: RequestOutput | None = None
        try:
            prompt = TokensPrompt(prompt_token_ids=req.prompt_token_ids)
            if req.tenant_salt:
                prompt["cache_salt"] = req.tenant_salt  # tenants never share device cache either
            stream = self._live().generate(
                prompt, params, req.request_id, trace_headers=self.tracing.vllm_headers(span)
            )
            loop = asyncio.get_running_loop()
            async for out in stream:
                last = out
                chunk = self._chunk(req, out, state, params.logprobs)
                if out.finished:
                    finished = True
                    self._log_timing(state, out)
                    chunk.finish_reason = FinishReason(out.outputs[0].finish_reason or "stop")
                    await self._finish_chunk(chunk, state, req)
                yield chunk
                # When outputs pile up (a busy machine), neither vLLM's output
                # queue nor the HTTP send ever suspends, so one stream would
                # starve every other handler (migrate, phase, stats) until it
                # ends. So at most every YIELD_EVERY_S, across all streams of
                # this worker, one of them yields to the loop. Yielding more
                # often reorders output delivery toward processor sharing and
                # lengthens mean E2E (docs/benchmarks.md, "stream yielding").
                now = loop.time()
                if now - self._last_yield >= YIELD_EVERY_S:
                    self._last_yield = now
                    await asyncio.sleep(0)
            if not finished and await self._dead_soon():
                # vLLM ends some streams of a dead core without an error once its
                # client shuts down (a request in its first prefill chunk): it
                # died under the request all the same (the gateway counts it
                # toward quarantine and continues it elsewhere). A request being
                # migrated too: a migration ends finished (MIGRATED), not cut.
                raise self._engine_dead(under_request=True)
        except EngineError:
            raise
        except Exception as exc:
            answer = await self._failure(req, exc)
            if answer is None:
                raise
            raise answer from exc
        finally:
            reason = state.finish.value if state.finish is not None else None
            self.tracing.end(span, req.request_id, out=last, generated=state.generated, finish=reason)
            if not finished:
                self._log_timing(state, None)
            self.inflight.pop(req.request_id, None)
            state.done.set()
            if not finished and self.ready:
                # The client went away (or we failed): free the engine's slot.
                await self._live().abort(req.request_id)

    def _check_serving(self, req: GenerateRequest) -> None:
        """Refuse `req` before the engine: not started (503, retryable), dead or restarting, bad input."""
        if self._llm is None and not self.started:
            raise EngineError("engine not ready", status=503, retryable=True)
        if self.state in (EngineState.DEAD, EngineState.RESTARTING):
            raise self._engine_dead()
        self.validate(req)

    def _chunk(self, req: GenerateRequest, out, state: Inflight, logprobs: int | None) -> GenerateChunk:
        """The delta chunk of one engine output (its finish set by the caller), counted in `state`."""
        comp = out.outputs[0]
        if not state.generated and comp.token_ids:
            state.first_token = self._first_token_timing(req, out)
        state.generated += len(comp.token_ids)
        return GenerateChunk(
            request_id=req.request_id,
            token_ids=list(comp.token_ids),
            text=comp.text,
            prompt_tokens=len(req.prompt_token_ids),
            cached_tokens=out.num_cached_tokens or 0,
            logprobs=token_logprobs(comp.token_ids, comp.logprobs, logprobs) if logprobs is not None else None,
        )

    async def _failure(self, req: GenerateRequest, exc: Exception) -> EngineError | None:
        """The `EngineError` answering a failure under `req`: input the engine refused (ValueError,
        TypeError, vLLM's client errors) or its death; None: raised as it is (a plain 500)."""
        from vllm.exceptions import VLLMClientError

        if isinstance(exc, (ValueError, TypeError, VLLMClientError)):
            # Sampling options are validated by the protocol already: with a
            # constraint present, vLLM refusing the request means the constraint.
            constrained = req.sampling.structured_output is not None
            return EngineError(str(exc), kind="invalid_structured_output" if constrained else "invalid_request")
        from vllm.v1.engine.exceptions import EngineDeadError

        # The core died under this request. Its error can reach the request
        # before the client counts itself errored: never a plain 500, which
        # the gateway would not count toward the request's quarantine.
        if isinstance(exc, EngineDeadError) or await self._dead_soon():
            return self._engine_dead(under_request=True)
        return None

    def _first_token_timing(self, req: GenerateRequest, out) -> dict | None:
        ttft = getattr(out.metrics, "first_token_latency", None)  # None when vLLM keeps no request stats
        if ttft is None:
            return None
        peers = sum(1 for b in req.kv.load if b.node_id != self.config.node_id) if req.kv else 0
        return {
            "request_id": req.request_id,
            "role": req.role,
            "t": time.time(),
            "engine_ttft_s": float(ttft),
            "peer_blocks": peers,
        }

    def _log_timing(self, state: Inflight, final) -> None:
        """One record per request that produced a token, when it ends (`final`:
        its last output, None when it stopped early)."""
        if state.first_token is None:
            return
        arrival = getattr(getattr(final, "metrics", None), "arrival_time", None)  # vLLM's frontend wall clock
        e2e = time.time() - arrival if arrival else None
        self.request_timings.append(**state.first_token, engine_e2e_s=e2e)
        state.first_token = None

    async def _finish_chunk(self, chunk: GenerateChunk, state: Inflight, req: GenerateRequest) -> None:
        # A migration asked for (`migrate`) while the engine was already finishing
        # the request ends it as the engine did: its last token may be the stop
        # token, and a continuation elsewhere would generate past it.
        migrated = state.migrate and chunk.finish_reason is FinishReason.ABORT
        saved = None
        if self.kv_events is not None and (req.role is Role.PREFILL or migrated):
            # The connector saves the request's full blocks when it finishes
            # (or is aborted for migration) and publishes where they went.
            saved = await self.kv_events.wait_saved(req.request_id, timeout=10.0)
        if saved is not None:
            chunk.saved_blocks = [
                BlockLocation(block_hash=h, node_id=self.config.node_id, slot=s) for h, s in saved.blocks
            ]
            chunk.external_cached_tokens = saved.external_tokens
        if migrated:
            chunk.finish_reason = FinishReason.MIGRATED
        state.finish = chunk.finish_reason

    async def abort(self, request_id: str) -> bool:
        if request_id not in self.inflight or not self.ready:
            return False
        await self._live().abort(request_id)
        return True

    async def migrate(self, request_ids: list[str]) -> list[str]:
        """Stop in-flight decodes so they can resume elsewhere from the pool."""
        targets = [
            r for rid, r in self.inflight.items() if r.role is Role.DECODE and (not request_ids or rid in request_ids)
        ]
        for r in targets:
            r.migrate = True
        if targets and self.ready:
            await self._live().abort([r.request_id for r in targets])
        for r in targets:
            await asyncio.wait_for(r.done.wait(), timeout=30.0)
        # Not those the engine finished before the abort reached it (`_finish_chunk`).
        return [r.request_id for r in targets if r.finish is FinishReason.MIGRATED]

    async def wait_idle(self, role: Role, deadline: float) -> bool:
        """Wait until no request of `role` is in flight or `deadline` (monotonic)."""
        while any(r.role is role for r in self.inflight.values()):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True
