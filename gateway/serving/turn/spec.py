"""One generation request, whatever API it came from (pure: no I/O, no vLLM).

The OpenAI chat and completions routes, the Responses API and the Anthropic
Messages API each turn their request into a `TurnSpec`: what the chat
template renders (or the raw prompt), how to sample, how many choices, and
the vLLM request object the output parser reads (`parsing`, opaque here).
`gateway.serving.turn.prepare.Preparer` turns a spec into worker jobs.

The pure rules every API shares live here too:

- `resolve_max_tokens`: the output budget. Unset, it is what the context
  leaves after the prompt (optionally capped); set, prompt + it must fit.
  Errors quote the numbers and the field the client sent, nothing internal.
- `choice_seeds`: one seed per choice. vLLM gives choice i of `n` the seed
  `seed + i`; the gateway runs choices as separate jobs with those seeds,
  so `n=2, seed=s` equals two requests with seeds s and s+1. A job that can
  only be resumed by replay (`replay_needs_seed`) gets a seed even when the
  client sent none, so a replay regenerates the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.http.errors import InvalidRequest

SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class Sampling:
    """The sampling fields every API maps onto (worker SamplingOptions, less max_tokens)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: none; k: the sampled token's and k alternatives per token


@dataclass(frozen=True)
class TurnSpec:
    """What to generate. Exactly one of `messages` (chat) and `prompt` (text or token ids) is set.

    `max_tokens` is what the client sent (None: not sent), under the name
    `max_tokens_param`, which errors quote. `parsing` is the vLLM request
    (chat or Responses) that tool calls, structured outputs and reasoning are
    read from; None when the output is plain text.
    """

    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None  # as the chat template sees them
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt: str | list[int] | None = None
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    n: int = 1
    sampling: Sampling = field(default_factory=Sampling)
    parsing: Any = None
    # The client field a constraint came from, named in its errors.
    constraint_param: str = "response_format"
    include_usage: bool = False  # streams end with a usage chunk
    # Sampling fields the client left out: the model's own defaults (its
    # generation_config.json, as vLLM's server reads it) apply to them.
    unset: frozenset[str] = frozenset()


# The fields a model's generation config may set defaults for (vLLM's `--generation-config auto`).
DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def unset_fields(req: Any) -> frozenset[str]:
    """The defaultable sampling fields a request object left as None."""
    return frozenset(name for name in DEFAULTABLE if getattr(req, name, None) is None)


def with_defaults(sampling: Sampling, unset: frozenset[str], defaults: dict[str, float | int]) -> Sampling:
    """`sampling` with the model's defaults in the fields the client left out."""
    from dataclasses import replace

    update: dict[str, Any] = {name: value for name, value in defaults.items() if name in unset and name in DEFAULTABLE}
    return replace(sampling, **update) if update else sampling


def resolve_max_tokens(
    prompt_tokens: int,
    requested: int | None,
    context_limit: int | None,
    *,
    param: str = "max_tokens",
    cap: int | None = None,
    fallback: int = 1024,
) -> int:
    """The output budget of one request (see the module docstring).

    `context_limit` is the model's context length (prompt + output tokens),
    None when no worker has reported it yet; `cap` an operator's upper bound
    for the default; `fallback` the default when the limit is unknown.
    """
    if context_limit is None:
        if requested is not None:
            return requested
        return min(cap, fallback) if cap is not None else fallback
    if prompt_tokens >= context_limit:
        raise InvalidRequest(
            f"This model's maximum context length is {context_limit} tokens. However, your messages resulted "
            f"in {prompt_tokens} tokens. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )
    if requested is None:
        left = context_limit - prompt_tokens
        return min(left, cap) if cap is not None else left
    if prompt_tokens + requested > context_limit:
        raise InvalidRequest(
            f"This model's maximum context length is {context_limit} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the messages, {requested} in `{param}`). "
            f"Please reduce the length of the messages or `{param}`.",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def choice_seeds(seed: int | None, n: int, *, needs_seed: bool, draw: int) -> list[int | None]:
    """Seeds of the `n` choices: `seed + i` (wrapping within the seed range).

    Without a client seed, choices are unseeded unless `needs_seed`; then
    `draw` (a random value the caller picked) stands in for it.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    base = seed if seed is not None else (draw % (SEED_MAX + 1) if needs_seed else None)
    if base is None:
        return [None] * n
    return [(base + i) % (SEED_MAX + 1) for i in range(n)]


def replay_needs_seed(temperature: float, resumable: bool) -> bool:
    """A job resumed by replay must sample the same tokens again: it needs a
    seed unless it is greedy."""
    return not resumable and temperature > 0.0
