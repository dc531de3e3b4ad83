"""The served model as the APIs see it: its names, its tokenizer, its context
length, the defaults it brings (one object the turn's parts read at call time,
so an operator's or a test's change reaches all of them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.http.errors import NotFound
from gateway.serving.policy.tenancy import TenantContext
from gateway.serving.tokenize import PromptTokenizer
from gateway.serving.turn.parsing import OutputParsing


@dataclass
class ServedModel:
    name: str
    tokenizer: PromptTokenizer
    parsing: OutputParsing
    default_max_tokens: int | None = None
    # An operator's bound on prompts (None: the context length decides).
    max_prompt_setting: int | None = None
    context_limit: Callable[[], int | None] = lambda: None  # the workers' context length (None: not known yet)
    aliases: dict[str, str] = field(default_factory=dict)
    # The model's recommended sampling (generation_config.json) for fields a request leaves out.
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)

    def context_length(self) -> int | None:
        """The context length served: the workers' engines' (heartbeats), else the model's own."""
        return self.context_limit() or self.tokenizer.context_length

    @property
    def max_prompt_tokens(self) -> int | None:
        """Longest prompt accepted: the operator's bound, else the context length
        the workers really serve (their engines' `max_model_len`, reported in
        heartbeats), else the model's own (config.json) until a worker reports."""
        if self.max_prompt_setting is not None:
            return self.max_prompt_setting
        return self.context_length()

    def check_model(self, model: str) -> None:
        """The name must be the served model or one of its aliases ("*": any
        name). Whether the key may use it is the tenant policy's (403 at admission)."""
        if model != self.name and model not in self.aliases and "*" not in self.aliases:
            raise NotFound(f"The model '{model}' does not exist", param="model", code="model_not_found")

    def models_for(self, tenant: TenantContext) -> list[str]:
        """The model names this tenant's key may use: the served model and its
        named aliases, when its policy allows the served model; else none."""
        if not tenant.allows_model(self.name):
            return []
        return [self.name, *(a for a in self.aliases if a != "*")]
