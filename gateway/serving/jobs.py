"""What the orchestrator is given and what a job's stream yields: the
validated `Job`, its `TokenDelta`s and its `Finished`. Plain values, read by
every API leaf and the accounting without importing the orchestrator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core import FinishReason, Phase
from workers.protocol import SamplingOptions, TokenLogprobs


@dataclass(frozen=True)
class Job:
    """One request, validated: `prompt_token_ids` come from the tokenizer (or were
    range-checked), `sampling` is a validated model, so the worker requests built
    from them skip pydantic validation (the worker validates what it receives)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingOptions
    tenant_salt: str
    branch_id: str | None = None
    # Block hashes of the prompt when already computed (`Directory.block_hashes`
    # of prompt_token_ids with tenant_salt): lookups and references reuse them.
    prompt_hashes: Sequence[str] = ()
    # False when the branch ends with this request: referencing its blocks at
    # the end would be undone right after (the branch is finished next).
    reference_blocks: bool = True


@dataclass(slots=True)  # one per relayed read: not frozen (a frozen init is 3x the cost), never mutated
class TokenDelta:
    token_ids: list[int]
    cached_tokens: int = 0  # prompt tokens served from cache (known from the first delta on)
    phase: Phase = Phase.DECODE  # the phase of the call that produced these tokens
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the job asked for them


class DeltaLane(Protocol):
    """A job's consumer taking token deltas as they arrive, while it waits
    for the stream's next event (`Orchestrator.stream(job, lane=...)`): the
    stream asks `ready()` before it changes anything for a delta, then hands
    the delta over; a delta handed over is not yielded. Called from I/O
    callbacks: no blocking, no awaiting."""

    def ready(self) -> bool:
        """True when the next delta can be taken now."""

    def __call__(self, delta: TokenDelta) -> None:
        """Take `delta` (only right after `ready()` said True)."""


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason  # STOP or LENGTH
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    e2e_s: float
    first_phase: Phase | None  # the phase of the call that produced the first token (None: no token)
    resumes: int = 0  # segments after the first decode (migrations, failovers)
    nodes: list[str] = field(default_factory=list)
