"""Request-level logic behind the OpenAI routes, free of HTTP objects.

`OpenAIService` turns a validated request into a job (tokenize once, apply
the branch contract, admit the tenant), runs it through the orchestrator and
turns token ids back into text (`TextAssembler`: incremental detokenizing
plus stop strings). The routes only read bodies/headers and write bytes.

No request may stall the others: a prompt of `offload_chars` characters or
more is rendered and tokenized in a worker thread (the Rust tokenizer
releases the GIL), and its block hashes are computed on the loop in slices
of `_HASH_SLICE_BLOCKS` blocks with a yield between them. Small prompts
stay inline: the thread hop costs more than their tokenization. A prompt of
`process_chars` or more goes to the tokenizer's own process when the app
gave one (`tokenize_process`): in a thread, the GIL the tokenizer takes back
in bursts stalled the loop for 100+ ms on a 3.5 MB prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from core import FinishReason
from core.ids import ID_RE
from gateway.control.workload_feed import LocalWorkloadFeed, WorkloadFeed
from gateway.http.errors import InvalidRequest, NotFound, RateLimited
from gateway.kv.directory import Directory
from gateway.metrics import GatewayMetrics
from gateway.serving.orchestrator import Finished, Job, Orchestrator, TokenDelta
from gateway.serving.policy.tenancy import TenantContext, TenantGate
from gateway.serving.tokenize import PromptTokenizer, StopStringFilter
from gateway.serving.tokenize_process import ProcessTokenizer, ProcessUnavailable
from gateway.serving.turn.parsing import Adjusted, OutputParsing, invalid_request
from gateway.serving.turn.spec import (
    TurnSpec,
    choice_seeds,
    replay_needs_seed,
    resolve_max_tokens,
    with_defaults,
)
from gateway.store.records import UsageRecord
from gateway.telemetry import end_span, start_span, turn_finished, turn_started
from planner.types import RequestSample
from workers.protocol import MAX_TOKENS_LIMIT, SamplingOptions

# Blocks hashed per slice of a big prompt (~3 ms on the loop at a time here).
_HASH_SLICE_BLOCKS = 1024


@dataclass(frozen=True)
class BranchContext:
    """The branch contract of one request, already validated and tenant-scoped."""

    key: str  # "<tenant>/<branch id>": branches of different tenants never collide
    branch_id: str
    parent_key: str | None
    session_id: str | None
    finish_at_end: bool  # X-Branch-Finished: true, or a one-request branch
    one_shot: bool = False  # no X-Branch-ID: a branch that lives for this request only


def _checked_id(value: str | None, header: str) -> str | None:
    if value is None or value == "":
        return None
    if not ID_RE.match(value):
        raise InvalidRequest(f"{header} must be 1-128 characters of [A-Za-z0-9._:-]", param=header)
    return value


def conversation_branch_id(conversation: str) -> str:
    """A branch id for a client's own conversation or session id (any text)."""
    return "conv-" + hashlib.sha256(conversation.encode()).hexdigest()[:40]


def parse_branch_headers(
    tenant_id: str,
    *,
    branch_id: str | None,
    parent_id: str | None,
    session_id: str | None,
    finished: str | None,
    conversation: str | None = None,
    parent_conversation: str | None = None,
) -> BranchContext:
    """The branch contract. Without `X-Branch-ID`, a `conversation` id the
    client sent its own way (`prompt_cache_key`, a Responses chain, a
    harness's session header, the conversation's opening) names the branch;
    with neither, the branch lives for this request only. Without
    `X-Parent-Branch-ID`, a sub-agent's `parent_conversation` names its parent."""
    bid = _checked_id(branch_id, "X-Branch-ID")
    parent = _checked_id(parent_id, "X-Parent-Branch-ID")
    if parent is None and parent_conversation:
        parent = conversation_branch_id(parent_conversation)
    session = _checked_id(session_id, "X-Session-ID")
    flag = (finished or "").strip().lower()
    if flag not in ("", "true", "false", "1", "0"):
        raise InvalidRequest("X-Branch-Finished must be 'true' or 'false'", param="X-Branch-Finished")
    if bid is None and conversation:
        bid = conversation_branch_id(conversation)
    one_shot = bid is None
    bid = bid or f"req-{uuid.uuid4().hex}"
    return BranchContext(
        key=f"{tenant_id}/{bid}",
        branch_id=bid,
        parent_key=f"{tenant_id}/{parent}" if parent else None,
        session_id=session,
        finish_at_end=one_shot or flag in ("true", "1"),
        one_shot=one_shot,
    )


def cache_salt(tenant_salt: str, model: str) -> str:
    """Hash salt per tenant *and* model (kvpool.hashing's contract), <= 128 chars."""
    salt = f"{tenant_salt}|{model}"
    return salt if len(salt) <= 128 else hashlib.sha256(salt.encode()).hexdigest()


def _constraint_param(spec: TurnSpec, adjusted: Adjusted | None) -> str:
    """The client field a worker's refusal of the constraint names: the tools when
    the constraint is vLLM's tool-call structural tag, else the format field."""
    so = adjusted.structured_output if adjusted is not None else None
    if so is not None and so.structural_tag is not None and getattr(adjusted.request, "tools", None):
        return "tools"
    return spec.constraint_param


def _prompt_chars(spec: TurnSpec) -> int:
    """About how many characters the prompt is made of (decides where it is tokenized)."""
    if spec.messages is None:
        return len(spec.prompt) if isinstance(spec.prompt, str) else 0  # token ids: nothing to tokenize
    return _chars(spec.messages) + _chars(spec.tools)


def _chars(value: object) -> int:
    """The characters of every string in a JSON-like value (no copy of the text)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_chars(v) for v in value)
    return 0


class TextAssembler:
    """Token ids -> text deltas, cut at the first stop string."""

    def __init__(self, tokenizer: PromptTokenizer, stops: list[str], *, skip_special_tokens: bool = True) -> None:
        self._detok = tokenizer.detokenizer(skip_special_tokens=skip_special_tokens)
        self._stops = StopStringFilter(stops)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    @property
    def matched_stop(self) -> str | None:
        return self._stops.matched

    def push(self, token_ids: list[int]) -> str:
        return self._stops.push(self._detok.push(token_ids))

    def flush(self) -> str:
        return self._stops.push(self._detok.flush()) + self._stops.flush()


@dataclass
class Prepared:
    """A request ready to run: everything decided before the first worker call.

    `jobs` holds one job per choice (`job` is the first). `adjusted` is set
    when the output is constrained or parsed (tools, structured outputs,
    reasoning); `plain` requests take the lean path (one job, text only).
    """

    request_id: str
    created: int
    tenant: TenantContext
    branch: BranchContext
    job: Job
    stops: list[str]
    include_usage: bool
    jobs: list[Job] = field(default_factory=list)
    adjusted: Adjusted | None = None
    logprobs: int | None = None
    constraint_param: str = "response_format"

    def __post_init__(self) -> None:
        if not self.jobs:
            self.jobs = [self.job]

    @property
    def plain(self) -> bool:
        return len(self.jobs) == 1 and self.adjusted is None and self.logprobs is None

    @property
    def skip_special_tokens(self) -> bool:
        return self.adjusted.skip_special_tokens if self.adjusted is not None else True


class OpenAIService:
    def __init__(
        self,
        *,
        model_name: str,
        tokenizer: PromptTokenizer,
        orchestrator: Orchestrator,
        gate: TenantGate,
        directory: Directory,
        metrics: GatewayMetrics,
        default_max_tokens: int | None = None,
        workload: WorkloadFeed | None = None,
        max_prompt_tokens: int | None = None,
        offload_chars: int = 16 * 1024,
        tokenize_threads: int = 2,
        process_tokenizer: ProcessTokenizer | None = None,
        process_chars: int = 256 * 1024,
        parsing: OutputParsing | None = None,
        context_limit: Callable[[], int | None] = lambda: None,
        model_aliases: dict[str, str] | None = None,
        sampling_defaults: dict[str, float | int] | None = None,
    ) -> None:
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.orchestrator = orchestrator
        self.gate = gate
        self.directory = directory
        self.metrics = metrics
        self.default_max_tokens = default_max_tokens
        # Finished requests for the planner's workload estimate (drained by it).
        # (the feed also works out each branch's turn gaps, cluster-wide on a shared feed)
        self.workload: WorkloadFeed = workload if workload is not None else LocalWorkloadFeed()
        # An operator's bound on prompts (None: the context length below decides).
        self._max_prompt_setting = max_prompt_tokens
        self.offload_chars = offload_chars
        self._tokenize_pool = ThreadPoolExecutor(max_workers=tokenize_threads, thread_name_prefix="tokenize")
        # Prompts of `process_chars` or more go to a process of their own (tokenize_process).
        self.process_tokenizer = process_tokenizer
        self.process_chars = process_chars
        self.parsing = parsing or OutputParsing(None, tokenizer, tool_parser=None)
        self.context_limit = context_limit  # the workers' context length (None: not known yet)
        self.model_aliases = dict(model_aliases or {})
        # The model's recommended sampling (generation_config.json) for fields a request leaves out.
        self.sampling_defaults = dict(sampling_defaults or {})

    def context_length(self) -> int | None:
        """The context length served: the workers' engines' (heartbeats), else the model's own."""
        return self.context_limit() or self.tokenizer.context_length

    @property
    def max_prompt_tokens(self) -> int | None:
        """Longest prompt accepted: the operator's bound, else the context length
        the workers really serve (their engines' `max_model_len`, reported in
        heartbeats), else the model's own (config.json) until a worker reports."""
        if self._max_prompt_setting is not None:
            return self._max_prompt_setting
        return self.context_length()

    def check_model(self, model: str) -> None:
        """The name must be the served model or one of its aliases ("*": any
        name). Whether the key may use it is the tenant policy's (403 at admission)."""
        if model != self.model_name and model not in self.model_aliases and "*" not in self.model_aliases:
            raise NotFound(f"The model '{model}' does not exist", param="model", code="model_not_found")

    def models_for(self, tenant: TenantContext) -> list[str]:
        """The model names this tenant's key may use: the served model and its
        named aliases, when its policy allows the served model; else none."""
        if not tenant.allows_model(self.model_name):
            return []
        return [self.model_name, *(a for a in self.model_aliases if a != "*")]

    async def prepare(self, spec: TurnSpec, tenant: TenantContext, branch: BranchContext, prefix: str) -> Prepared:
        """Tokenize once, fix the output budget and constraint, make one job per choice."""
        salt = cache_salt(tenant.cache_salt, self.model_name)
        chars = _prompt_chars(spec)
        span = start_span("tokenize", **{"evolving.prompt_chars": chars})  # template + tokens + block hashes
        if chars < self.offload_chars:
            tokens = self._tokens(spec)
            hashes = self.directory.block_hashes(tokens, salt)
        elif chars >= self.process_chars and self.process_tokenizer is not None:
            try:
                tokens, hashes = await self._tokens_in_process(self.process_tokenizer, spec, salt)
            except ProcessUnavailable:
                tokens, hashes = await self._tokens_in_thread(spec, salt)
        else:
            tokens, hashes = await self._tokens_in_thread(spec, salt)
        end_span(span, **{"gen_ai.usage.input_tokens": len(tokens), "evolving.prompt_blocks": len(hashes)})
        max_tokens = resolve_max_tokens(
            len(tokens),
            spec.max_tokens,
            self.context_length(),
            param=spec.max_tokens_param,
            # never a default past what a worker accepts (a tokenizer-only folder may claim a huge context)
            cap=min(self.default_max_tokens or MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT),
        )
        adjusted = self.parsing.adjust(spec.parsing, constraint_param=spec.constraint_param) if spec.parsing else None
        s = with_defaults(spec.sampling, spec.unset, self.sampling_defaults)
        try:
            sampling = SamplingOptions(
                max_tokens=max_tokens,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                min_p=s.min_p,
                seed=None,
                stop=list(s.stop),
                stop_token_ids=list(s.stop_token_ids),
                ignore_eos=s.ignore_eos,
                min_tokens=s.min_tokens,
                presence_penalty=s.presence_penalty,
                frequency_penalty=s.frequency_penalty,
                repetition_penalty=s.repetition_penalty,
                logit_bias=s.logit_bias,
                logprobs=s.logprobs,
                structured_output=adjusted.structured_output if adjusted is not None else None,
            )
        except ValidationError as exc:
            err = invalid_request(exc)
            if err.param and err.param.split(".")[0] == "max_tokens":  # the worker's name for it
                err = InvalidRequest(
                    err.message.replace("max_tokens", spec.max_tokens_param), param=spec.max_tokens_param
                )
            raise err from exc
        self._check_token_ids(sampling)
        seeds = choice_seeds(
            s.seed,
            spec.n,
            needs_seed=replay_needs_seed(sampling.temperature, sampling.resumable),
            draw=secrets.randbits(63),
        )
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        jobs = [
            Job(
                request_id=request_id if spec.n == 1 else f"{request_id}-{i}",
                prompt_token_ids=tokens,
                sampling=sampling.model_copy(update={"seed": seed}),
                tenant_salt=salt,
                branch_id=branch.key,
                prompt_hashes=hashes,
                reference_blocks=not branch.finish_at_end,
            )
            for i, seed in enumerate(seeds)
        ]
        turn_started(
            model=self.model_name,
            request_id=request_id,
            tenant=tenant.tenant_id,
            branch=branch.branch_id,
            session=branch.session_id,
            max_tokens=max_tokens,
            choices=len(jobs),
        )
        return Prepared(
            request_id,
            int(time.time()),
            tenant,
            branch,
            jobs[0],
            list(s.stop),
            spec.include_usage,
            jobs=jobs,
            adjusted=adjusted if adjusted is not None and (adjusted.parses or adjusted.structured_output) else None,
            logprobs=s.logprobs,
            constraint_param=_constraint_param(spec, adjusted),
        )

    def _tokens(self, spec: TurnSpec) -> list[int]:
        """The prompt's token ids (template applied); refuses empty and too long prompts."""
        if spec.messages is not None:
            tokens = self.tokenizer.encode_chat(
                spec.messages, tools=spec.tools, template_kwargs=spec.template_kwargs, max_tokens=self.max_prompt_tokens
            )
        else:
            tokens = self._completion_tokens(spec.prompt)
        if not tokens:
            raise InvalidRequest("the prompt is empty after tokenization", param="prompt")
        return tokens

    async def _tokens_in_thread(self, spec: TurnSpec, salt: str) -> tuple[list[int], list[str]]:
        tokens = await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, self._tokens, spec)
        return tokens, await self._hash_in_slices(tokens, salt)

    async def _tokens_in_process(
        self, proc: ProcessTokenizer, spec: TurnSpec, salt: str
    ) -> tuple[list[int], list[str]]:
        """`_tokens` in the tokenizer's process; the ids become the job's list
        and its block hashes here, in slices, yielding to the loop between them.
        (A prompt of token ids counts no characters: it never comes here.)"""
        ids = await proc.encode(
            messages=spec.messages,
            tools=spec.tools,
            template_kwargs=spec.template_kwargs,
            text=spec.prompt if spec.messages is None else None,
            max_tokens=self.max_prompt_tokens,
        )
        if len(ids) == 0:
            raise InvalidRequest("the prompt is empty after tokenization", param="prompt")
        step = _HASH_SLICE_BLOCKS * self.directory.block_size
        tokens: list[int] = []
        hashes: list[str] = []
        for start in range(0, len(ids), step):
            end = min(start + step, len(ids))
            tokens.extend(ids[start:end].tolist())
            hashes = self.directory.block_hashes(ids[:end], salt, known=hashes)
            if end < len(ids):
                await asyncio.sleep(0)
        return tokens, hashes

    def close(self) -> None:
        """Stop the tokenizer's process, if one was started (the app's shutdown)."""
        if self.process_tokenizer is not None:
            self.process_tokenizer.close()

    async def _hash_in_slices(self, tokens: list[int], salt: str) -> list[str]:
        """`directory.block_hashes(tokens, salt)`, yielding to the loop between slices.

        The ids become an int64 array here, slice by slice, not in the
        tokenizing thread: one `np.asarray` of a million-element list holds
        the GIL for ~26 ms in a single C call, which no thread switch can
        interrupt, and the loop waited for it (docs/benchmarks.md)."""
        step = _HASH_SLICE_BLOCKS * self.directory.block_size
        array = np.empty(len(tokens), dtype=np.int64)
        hashes: list[str] = []
        for start in range(0, len(tokens), step):
            end = min(start + step, len(tokens))
            array[start:end] = tokens[start:end]
            hashes = self.directory.block_hashes(array[:end], salt, known=hashes)
            if end < len(tokens):
                await asyncio.sleep(0)
        return hashes

    def _check_token_ids(self, sampling: SamplingOptions) -> None:
        vocab = self.tokenizer.vocab_size
        for param, ids in (("stop_token_ids", sampling.stop_token_ids), ("logit_bias", list(sampling.logit_bias))):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise InvalidRequest(
                    f"token id {bad[0]} in `{param}` is out of the vocabulary (size {vocab})", param=param
                )

    def _completion_tokens(self, prompt: str | list[int] | None) -> list[int]:
        limit = self.max_prompt_tokens
        if prompt is None:
            return []
        if isinstance(prompt, str):
            return self.tokenizer.encode_text(prompt, max_tokens=limit)
        ids = [int(t) for t in prompt]
        if any(t < 0 or t >= self.tokenizer.vocab_size for t in ids):
            raise InvalidRequest("prompt token id out of the vocabulary", param="prompt")
        if limit is not None and len(ids) > limit:
            raise InvalidRequest(
                f"This model's maximum context length is {limit} tokens; the prompt has {len(ids)} tokens.",
                param="prompt",
                code="context_length_exceeded",
            )
        return ids

    async def _check_new_branch(self, p: Prepared) -> None:
        """The tenant's branch cap, for a request that opens a named branch.

        One-request branches (no X-Branch-ID) are exempt: they end with the
        request, which `max_concurrent` already bounds.
        """
        if p.tenant.max_active_branches is None or p.branch.one_shot:
            return
        if not await self.directory.is_branch_active(p.branch.key):
            self.gate.check_branch_limit(p.tenant, await self.directory.active_branch_count(p.tenant.tenant_id))

    @contextlib.asynccontextmanager
    async def admitted(self, p: Prepared) -> AsyncIterator[None]:
        """Hold the tenant's slot and the branch for the request's lifetime."""
        # Checked before admission so a refused branch costs no rate-limit
        # budget, and again, atomically across replicas, when the directory
        # opens it (concurrent openers cannot overshoot the cap).
        async with contextlib.AsyncExitStack() as held:
            span = start_span("admission", **{"evolving.tenant": p.tenant.tenant_id})  # limits, queueing, branch
            try:
                await self._check_new_branch(p)
                await held.enter_async_context(
                    self.gate.admit(
                        p.tenant,
                        model=self.model_name,
                        prompt_tokens=len(p.job.prompt_token_ids),
                        max_tokens=sum(job.sampling.max_tokens for job in p.jobs),
                    )
                )
                cap = None if p.branch.one_shot else p.tenant.max_active_branches
                opened = await self.directory.open_branch(
                    p.branch.key,
                    tenant_id=p.tenant.tenant_id,
                    parent_id=p.branch.parent_key,
                    session_id=p.branch.session_id,
                    kv_retention_blocks=p.tenant.kv_retention_blocks,
                    max_active_branches=cap,
                )
                if not opened:
                    self.gate.check_branch_limit(p.tenant, cap or 0)  # raises RateLimited
            except RateLimited as exc:
                self.workload.count_rejection()  # offered load the planner must see, though refused
                end_span(span, error=exc.message)
                raise
            end_span(span)
            self.workload.count_arrival()
            try:
                yield
            finally:
                if p.branch.finish_at_end:
                    await self.directory.finish_branch(p.branch.key)

    async def run(self, p: Prepared) -> AsyncIterator[str | Finished]:
        """Text deltas, then one `Finished` (finish_reason "stop" when a stop string hit).

        The lean path of `plain` requests; the others run through
        `gateway.serving.turn.choices`."""
        text = TextAssembler(self.tokenizer, p.stops)
        t0 = time.monotonic()
        count = cached = 0
        ttft = 0.0
        phase = "decode"
        async with contextlib.aclosing(self.orchestrator.stream(p.job)) as events:
            async for ev in events:
                if isinstance(ev, TokenDelta):
                    if not count:
                        ttft, phase = time.monotonic() - t0, ev.phase
                    count += len(ev.token_ids)
                    cached = ev.cached_tokens
                    delta = text.push(ev.token_ids)
                    if delta:
                        yield delta
                    if text.stopped:
                        break
                else:
                    tail = text.flush()
                    if tail:
                        yield tail
                    self._account(p, ev)
                    yield ev
                    return
        # A stop string ended the text before the worker finished.
        done = Finished(
            FinishReason.STOP, len(p.job.prompt_token_ids), cached, count, ttft, time.monotonic() - t0, phase
        )
        self._account(p, done)
        yield done

    def account(self, p: Prepared, done: Finished) -> None:
        """Record one finished job: planner sample, metrics, tenant usage."""
        self._account(p, done)

    def _account(self, p: Prepared, done: Finished) -> None:
        arrival = time.time() - done.e2e_s
        self.workload.add(
            RequestSample(
                t=arrival,
                uncached_prompt_tokens=done.prompt_tokens - done.cached_tokens,
                cached_prompt_tokens=done.cached_tokens,
                output_tokens=done.completion_tokens,
                e2e_s=done.e2e_s,
            ),
            branch=None if p.branch.one_shot else p.branch.key,
            last_in_branch=p.branch.finish_at_end,
        )
        self.metrics.observe_finished(p.tenant.tenant_id, done)
        turn_finished(
            prompt_tokens=done.prompt_tokens,
            cached_tokens=done.cached_tokens,
            completion_tokens=done.completion_tokens,
            finish_reason=done.finish_reason.value,
            first_phase=done.first_phase,
            nodes=done.nodes,
            resumes=done.resumes,
            ttft_s=done.ttft_s,
        )
        self.gate.record_usage(
            UsageRecord(
                tenant_id=p.tenant.tenant_id,
                model=self.model_name,
                prompt_tokens=done.prompt_tokens,
                cached_tokens=done.cached_tokens,
                completion_tokens=done.completion_tokens,
            )
        )

    @staticmethod
    def usage_dict(done: Finished) -> dict[str, Any]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        }
