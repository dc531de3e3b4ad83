"""A spec made ready to run: tokenized once, the output budget and
constraint fixed, the API's sampling mapped onto the workers', one job per
choice. Everything decided before the first worker call."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field

from pydantic import ValidationError

from gateway.http.errors import InvalidRequest
from gateway.serving.jobs import Job
from gateway.serving.policy.tenancy import TenantContext
from gateway.serving.turn.branch import BranchContext
from gateway.serving.turn.model import ServedModel
from gateway.serving.turn.parsing import Adjusted, invalid_request
from gateway.serving.turn.spec import (
    Sampling,
    TurnSpec,
    choice_seeds,
    replay_needs_seed,
    resolve_max_tokens,
    with_defaults,
)
from gateway.serving.turn.tokens import PromptTokens
from gateway.telemetry import turn_started
from workers.protocol import MAX_TOKENS_LIMIT, SamplingOptions


@dataclass
class Prepared:
    """A request ready to run.

    `jobs` holds one job per choice (`job` is the first). `adjusted` is set
    when the output is constrained or parsed (tools, structured outputs,
    reasoning); `plain` requests take the lean strategy (one job, text only).
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


def cache_salt(tenant_salt: str, model: str) -> str:
    """Hash salt per tenant *and* model (kvpool.hashing's contract), <= 128 chars."""
    salt = f"{tenant_salt}|{model}"
    return salt if len(salt) <= 128 else hashlib.sha256(salt.encode()).hexdigest()


def _constraint_param(spec: TurnSpec, adjusted: Adjusted | None) -> str:
    """The client field a worker's refusal of the constraint names: the tools when
    the constraint is vLLM's tool-call structural tag, else the format field."""
    so = adjusted.structured_output if adjusted is not None else None
    if (
        adjusted is not None
        and so is not None
        and so.structural_tag is not None
        and getattr(adjusted.request, "tools", None)
    ):
        return "tools"
    return spec.constraint_param


def sampling_options(s: Sampling, max_tokens: int, adjusted: Adjusted | None, max_tokens_param: str) -> SamplingOptions:
    """The API's sampling as the workers' options; a refusal names the client's field."""
    try:
        return SamplingOptions(
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
            err = InvalidRequest(err.message.replace("max_tokens", max_tokens_param), param=max_tokens_param)
        raise err from exc


class Preparer:
    def __init__(self, model: ServedModel, tokens: PromptTokens) -> None:
        self.model = model
        self.tokens = tokens

    async def prepare(self, spec: TurnSpec, tenant: TenantContext, branch: BranchContext, prefix: str) -> Prepared:
        """Tokenize once, fix the output budget and constraint, make one job per choice."""
        model = self.model
        salt = cache_salt(tenant.cache_salt, model.name)
        tokens, hashes = await self.tokens.encode(spec, salt)
        max_tokens = resolve_max_tokens(
            len(tokens),
            spec.max_tokens,
            model.context_length(),
            param=spec.max_tokens_param,
            # never a default past what a worker accepts (a tokenizer-only folder may claim a huge context)
            cap=min(model.default_max_tokens or MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT),
        )
        adjusted = model.parsing.adjust(spec.parsing, constraint_param=spec.constraint_param) if spec.parsing else None
        s = with_defaults(spec.sampling, spec.unset, model.sampling_defaults)
        sampling = sampling_options(s, max_tokens, adjusted, spec.max_tokens_param)
        self._check_token_ids(sampling)
        needs_seed = replay_needs_seed(sampling.temperature, sampling.resumable)
        # A random stand-in seed only when one is needed (a system call less per request otherwise).
        draw = secrets.randbits(63) if needs_seed and s.seed is None else 0
        seeds = choice_seeds(s.seed, spec.n, needs_seed=needs_seed, draw=draw)
        request_id = f"{prefix}-{secrets.token_hex(16)}"
        jobs = [
            Job(
                request_id=request_id if spec.n == 1 else f"{request_id}-{i}",
                prompt_token_ids=tokens,
                # the options as built (their seed None) for an unseeded first choice: no copy
                sampling=sampling if seed is None and i == 0 else sampling.model_copy(update={"seed": seed}),
                tenant_salt=salt,
                branch_id=branch.key,
                prompt_hashes=hashes,
                reference_blocks=not branch.finish_at_end,
            )
            for i, seed in enumerate(seeds)
        ]
        turn_started(
            model=model.name,
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

    def _check_token_ids(self, sampling: SamplingOptions) -> None:
        vocab = self.model.tokenizer.vocab_size
        for param, ids in (("stop_token_ids", sampling.stop_token_ids), ("logit_bias", list(sampling.logit_bias))):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise InvalidRequest(
                    f"token id {bad[0]} in `{param}` is out of the vocabulary (size {vocab})", param=param
                )
