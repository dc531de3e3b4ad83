"""Request-level logic behind the OpenAI routes, free of HTTP objects.

`OpenAIService` turns a validated request into a job (tokenize once, apply
the branch contract, admit the tenant), runs it through the orchestrator and
turns token ids back into text (`TextAssembler`: incremental detokenizing
plus stop strings). The routes only read bodies/headers and write bytes.

No request may stall the others: a prompt of `offload_chars` characters or
more is rendered and tokenized in a worker thread (the Rust tokenizer
releases the GIL), and its block hashes are computed on the loop in slices
of `_HASH_SLICE_BLOCKS` blocks with a yield between them. Small prompts
stay inline: the thread hop costs more than their tokenization.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from core import FinishReason
from core.ids import ID_RE
from gateway.control.workload_feed import LocalWorkloadFeed, WorkloadFeed
from gateway.directory import Directory
from gateway.errors import InvalidRequest, NotFound
from gateway.metrics import GatewayMetrics
from gateway.serving.openai.schemas import ChatCompletionRequest, CompletionRequest, FunctionCall, ToolCall
from gateway.serving.orchestrator import Finished, Job, Orchestrator, TokenDelta
from gateway.serving.tenancy import TenantContext, TenantGate
from gateway.serving.tokenize import PromptTokenizer, StopStringFilter
from gateway.store.records import UsageRecord
from planner.types import RequestSample
from workers.protocol import SamplingOptions

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
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


def parse_branch_headers(
    tenant_id: str, *, branch_id: str | None, parent_id: str | None, session_id: str | None, finished: str | None
) -> BranchContext:
    bid = _checked_id(branch_id, "X-Branch-ID")
    parent = _checked_id(parent_id, "X-Parent-Branch-ID")
    session = _checked_id(session_id, "X-Session-ID")
    flag = (finished or "").strip().lower()
    if flag not in ("", "true", "false", "1", "0"):
        raise InvalidRequest("X-Branch-Finished must be 'true' or 'false'", param="X-Branch-Finished")
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


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split `<tool_call>{"name", "arguments"}</tool_call>` blocks out of the text."""
    calls: list[ToolCall] = []
    for m in _TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        calls.append(
            ToolCall(
                id=f"call_{uuid.uuid4().hex[:24]}",
                function=FunctionCall(name=obj["name"], arguments=args if isinstance(args, str) else json.dumps(args)),
            )
        )
    if not calls:
        return text, []
    return _TOOL_CALL_RE.sub("", text).strip(), calls


def _prompt_chars(req: ChatCompletionRequest | CompletionRequest) -> int:
    """About how many characters the prompt is made of (decides where it is tokenized)."""
    if isinstance(req, CompletionRequest):
        prompt = req.prompt
        if isinstance(prompt, str):
            return len(prompt)
        return len(prompt[0]) if prompt and isinstance(prompt[0], str) else 0  # token ids: nothing to tokenize
    n = 0
    for m in req.messages:
        content = m.content
        n += len(content) if isinstance(content, str) else sum(len(p.text or "") for p in content or ())
        n += sum(len(c.function.arguments) for c in m.tool_calls or ())
    return n + (len(orjson.dumps(req.tools)) if req.tools else 0)


class TextAssembler:
    """Token ids -> text deltas, cut at the first stop string."""

    def __init__(self, tokenizer: PromptTokenizer, stops: list[str]) -> None:
        self._detok = tokenizer.detokenizer()
        self._stops = StopStringFilter(stops)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def push(self, token_ids: list[int]) -> str:
        return self._stops.push(self._detok.push(token_ids))

    def flush(self) -> str:
        return self._stops.push(self._detok.flush()) + self._stops.flush()


@dataclass
class Prepared:
    """A request ready to run: everything decided before the first worker call."""

    request_id: str
    created: int
    tenant: TenantContext
    branch: BranchContext
    job: Job
    stops: list[str]
    include_usage: bool


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
        default_max_tokens: int,
        workload: WorkloadFeed | None = None,
        max_prompt_tokens: int | None = None,
        offload_chars: int = 16 * 1024,
        tokenize_threads: int = 2,
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
        # Longest prompt accepted (None: no limit here; the workers still check theirs).
        self.max_prompt_tokens = max_prompt_tokens
        self.offload_chars = offload_chars
        self._tokenize_pool = ThreadPoolExecutor(max_workers=tokenize_threads, thread_name_prefix="tokenize")

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise NotFound(f"The model '{model}' does not exist", param="model", code="model_not_found")

    async def prepare(
        self, req: ChatCompletionRequest | CompletionRequest, tenant: TenantContext, branch: BranchContext, prefix: str
    ) -> Prepared:
        self.check_model(req.model)
        salt = cache_salt(tenant.cache_salt, self.model_name)
        if _prompt_chars(req) < self.offload_chars:
            tokens = self._tokens(req)
            hashes = self.directory.block_hashes(tokens, salt)
        else:
            loop = asyncio.get_running_loop()
            tokens, array = await loop.run_in_executor(self._tokenize_pool, self._tokens_and_array, req)
            hashes = await self._hash_in_slices(array, salt)
        if isinstance(req, ChatCompletionRequest):
            max_tokens = req.requested_max_tokens() or self.default_max_tokens
        else:
            max_tokens = req.max_tokens or self.default_max_tokens
        sampling = SamplingOptions(
            max_tokens=max_tokens,
            temperature=req.temperature if req.temperature is not None else 1.0,
            top_p=req.top_p if req.top_p is not None else 1.0,
            seed=req.seed,
            stop=req.stop_list(),
        )
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        job = Job(
            request_id=request_id,
            prompt_token_ids=tokens,
            sampling=sampling,
            tenant_salt=salt,
            branch_id=branch.key,
            prompt_hashes=hashes,
            reference_blocks=not branch.finish_at_end,
        )
        return Prepared(request_id, int(time.time()), tenant, branch, job, req.stop_list(), req.include_usage)

    def _tokens(self, req: ChatCompletionRequest | CompletionRequest) -> list[int]:
        """The prompt's token ids (template applied); refuses empty and too long prompts."""
        limit = self.max_prompt_tokens
        if isinstance(req, ChatCompletionRequest):
            tokens = self.tokenizer.encode_chat(
                [m.template_dict() for m in req.messages],
                tools=req.tools,
                tool_choice=req.tool_choice,
                max_tokens=limit,
            )
        else:
            tokens = self._completion_tokens(req.prompt)
        if not tokens:
            raise InvalidRequest("the prompt is empty after tokenization", param="prompt")
        return tokens

    def _tokens_and_array(self, req: ChatCompletionRequest | CompletionRequest) -> tuple[list[int], np.ndarray]:
        """`_tokens` plus the ids as int64 (in the worker thread: the hashing slices take views of it)."""
        tokens = self._tokens(req)
        return tokens, np.asarray(tokens, dtype=np.int64)

    async def _hash_in_slices(self, token_ids: np.ndarray, salt: str) -> list[str]:
        """`directory.block_hashes(token_ids, salt)`, yielding to the loop between slices."""
        step = _HASH_SLICE_BLOCKS * self.directory.block_size
        hashes: list[str] = []
        for end in range(step, len(token_ids) + step, step):
            hashes = self.directory.block_hashes(token_ids[:end], salt, known=hashes)
            if end < len(token_ids):
                await asyncio.sleep(0)
        return hashes

    def _completion_tokens(self, prompt: str | list[int] | list[str]) -> list[int]:
        limit = self.max_prompt_tokens
        if isinstance(prompt, str):
            return self.tokenizer.encode_text(prompt, max_tokens=limit)
        if prompt and isinstance(prompt[0], str):
            return self.tokenizer.encode_text(str(prompt[0]), max_tokens=limit)
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
        await self._check_new_branch(p)
        async with self.gate.admit(
            p.tenant,
            model=self.model_name,
            prompt_tokens=len(p.job.prompt_token_ids),
            max_tokens=p.job.sampling.max_tokens,
        ):
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
            try:
                yield
            finally:
                if p.branch.finish_at_end:
                    await self.directory.finish_branch(p.branch.key)

    async def run(self, p: Prepared) -> AsyncIterator[str | Finished]:
        """Text deltas, then one `Finished` (finish_reason "stop" when a stop string hit)."""
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
