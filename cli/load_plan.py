"""The agent load of `evolving-infra load`, planned (pure: data in, plan out).

Two kinds of phase, both replayed from real agent sessions in
`../shared/traces/agents` (text, so the gateway tokenizes, caches and
routes them like any client's):

- **decode-heavy** — reasoning agents: the tau-bench customer-service
  sessions, each turn's real conversation as the prompt (consecutive turns
  share their prefix, so the new part is short and runs on a decode node),
  and long answers: `max_tokens` drawn from ServeGen's DeepSeek-R1
  output-length distribution, scaled to `LoadConfig.decode_output_mean`.
- **prefill-heavy** — coding agents: the OpenCode and Aider sessions, whose
  turns carry tens of thousands of characters of tool output. Each prompt
  is the context cut to fit the model: its head (the system prompt: cached
  after the first turn) and its newest part (tool output the model has not
  seen: computed fresh), `prefill_prompt_tokens` in all, with a short answer
  (the trace's own completion length, capped at `prefill_output_max`).

Agents run closed loop: a turn starts when the agent's previous turn ended
plus its tool time (the trace's gap, capped at `max_gap_s`). Every request
carries `X-Session-ID` and `X-Branch-ID`; a session's last turn carries
`X-Branch-Finished: true`.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

# Tokens the chat template adds around a prompt (role headers, a default system
# prompt), kept free of the context.
T = TypeVar("T")
TEMPLATE_TOKENS = 128  # a stock template may add its default system prompt too (SmolLM2 does)


class Codec(Protocol):
    """Token arithmetic on text, with the served model's tokenizer (or an estimate)."""

    def count(self, text: str) -> int: ...

    def cut(self, text: str, head: int, total: int) -> tuple[str, str]:
        """(its first `head` tokens, the rest) of `text`, the rest cut to its
        last `total - head` tokens when `text` has more than `total`."""
        ...


@dataclass(frozen=True)
class TokenizerCodec:
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def cut(self, text: str, head: int, total: int) -> tuple[str, str]:
        ids = head_and_tail(self.encode(text), head, total)
        return self.decode(ids[:head]), self.decode(ids[head:])


@dataclass(frozen=True)
class CharCodec:
    """No tokenizer at hand: `chars_per_token` characters make one token (the
    demo model's tokenizer gives 2.5 on these traces; a rounder guess would
    overfill a small context)."""

    chars_per_token: float = 2.5

    def count(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)

    def cut(self, text: str, head: int, total: int) -> tuple[str, str]:
        h = int(head * self.chars_per_token)
        if self.count(text) <= total:
            return text[:h], text[h:]
        t = int((total - head) * self.chars_per_token)
        return text[:h], text[max(h, len(text) - t) :]


class PhaseKind(str, enum.Enum):
    DECODE_HEAVY = "decode"
    PREFILL_HEAVY = "prefill"

    @property
    def label(self) -> str:
        return "decode-heavy" if self is PhaseKind.DECODE_HEAVY else "prefill-heavy"


@dataclass(frozen=True)
class LoadConfig:
    """phase_s: seconds per phase (> 0).
    phases: the kinds, in order, repeated until the load stops (≥ 1).
    agents_decode / agents_prefill: concurrent agents in each kind of phase (≥ 1).
    max_context_tokens: the served model's context (prompt + output must fit; ≥ 256).
    decode_output_mean / decode_output_max: output tokens of decode-heavy turns (≥ 1).
    prefill_prompt_tokens / prefill_head_tokens: prompt size of prefill-heavy
        turns and how much of it is the session's head (0 ≤ head < prompt).
    prefill_output_max: cap on prefill-heavy answers (≥ 1).
    max_gap_s: cap on an agent's tool time between turns (≥ 0).
    seed: session order and output lengths.
    """

    phase_s: float = 180.0
    phases: tuple[PhaseKind, ...] = (PhaseKind.PREFILL_HEAVY, PhaseKind.DECODE_HEAVY)
    agents_decode: int = 24
    agents_prefill: int = 4
    max_context_tokens: int = 4096
    decode_output_mean: int = 384
    decode_output_max: int = 1024
    prefill_prompt_tokens: int = 2048
    prefill_head_tokens: int = 256
    prefill_output_max: int = 24
    max_gap_s: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.phase_s <= 0 or not self.phases:
            raise ValueError("phase_s must be > 0 and phases non-empty")
        if min(self.agents_decode, self.agents_prefill) < 1:
            raise ValueError("agents_decode and agents_prefill must be >= 1")
        if self.max_context_tokens < 256:
            raise ValueError("max_context_tokens must be >= 256")
        if min(self.decode_output_mean, self.decode_output_max, self.prefill_output_max) < 1:
            raise ValueError("output lengths must be >= 1")
        if not 0 <= self.prefill_head_tokens < self.prefill_prompt_tokens:
            raise ValueError("need 0 <= prefill_head_tokens < prefill_prompt_tokens")
        if self.prefill_prompt_tokens + self.prefill_output_max > self.max_context_tokens:
            raise ValueError("prefill_prompt_tokens + prefill_output_max must fit max_context_tokens")
        if self.decode_output_max + 4 * TEMPLATE_TOKENS > self.max_context_tokens:
            raise ValueError(f"decode_output_max must leave {4 * TEMPLATE_TOKENS} tokens of max_context_tokens")
        if self.max_gap_s < 0:
            raise ValueError("max_gap_s must be >= 0")

    def agents(self, kind: PhaseKind) -> int:
        return self.agents_decode if kind is PhaseKind.DECODE_HEAVY else self.agents_prefill


@dataclass(frozen=True)
class SourceTurn:
    """One turn as the trace has it (what `sim.traces.load_agent_text` yields)."""

    session_id: str
    prompt: str
    completion: str
    gap_s: float  # tool time before this turn (0 for a session's first)


@dataclass(frozen=True)
class Turn:
    """One request of a replayed session. The prompt sent is `shared`, then a
    line naming the agent's branch, then `own`: every replay of a session is
    a different agent, so only `shared` (a tool's system prompt) is cached
    across agents, while a session's own turns extend each other as in the trace."""

    own: str
    max_tokens: int
    gap_s: float  # wait after the agent's previous turn ended
    last: bool  # the session's last turn: X-Branch-Finished
    shared: str = ""

    def prompt(self, branch: str) -> str:
        return f"{self.shared}\n[agent {branch}]\n{self.own}" if self.shared else f"[agent {branch}]\n{self.own}"


@dataclass(frozen=True)
class Session:
    source: str  # trace session id
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class LengthPdf:
    """A discrete length distribution (values and probabilities summing to 1)."""

    values: np.ndarray
    probs: np.ndarray

    @classmethod
    def of(cls, table: dict[int, float]) -> LengthPdf:
        values = np.array(sorted(table), dtype=float)
        probs = np.array([table[int(v)] for v in values], dtype=float)
        if values.size == 0 or probs.sum() <= 0:
            raise ValueError("empty length distribution")
        return cls(values, probs / probs.sum())

    @property
    def mean(self) -> float:
        return float(np.dot(self.values, self.probs))

    def sample_scaled(self, rng: random.Random, mean: float, lo: int, hi: int) -> int:
        """One draw, scaled so the distribution's mean is `mean`, clipped to [lo, hi]."""
        u = rng.random()
        i = int(np.searchsorted(np.cumsum(self.probs), u, side="right"))
        v = self.values[min(i, self.values.size - 1)] * mean / self.mean
        return int(min(max(round(v), lo), hi))


def head_and_tail(tokens: list[T], head: int, total: int) -> list[T]:
    """The first `head` tokens and the last `total - head`, or all if they fit."""
    if len(tokens) <= total:
        return tokens
    return tokens[:head] + tokens[len(tokens) - (total - head) :]


def by_session(turns: Sequence[SourceTurn]) -> list[list[SourceTurn]]:
    """Turns grouped by session, sessions in order of first appearance."""
    groups: dict[str, list[SourceTurn]] = {}
    for t in turns:
        groups.setdefault(t.session_id, []).append(t)
    return [g for g in groups.values() if g]


def decode_sessions(turns: Sequence[SourceTurn], config: LoadConfig, codec: Codec, pdf: LengthPdf) -> list[Session]:
    """Decode-heavy sessions: the real conversation, long sampled answers."""
    rng = random.Random(config.seed)
    room = config.max_context_tokens - config.decode_output_max - TEMPLATE_TOKENS
    out = []
    for group in by_session(turns):
        planned = []
        for i, t in enumerate(group):
            head, rest = codec.cut(t.prompt, room // 4, room)
            n = pdf.sample_scaled(rng, config.decode_output_mean, 16, config.decode_output_max)
            planned.append(Turn(head + rest, n, min(t.gap_s, config.max_gap_s), i == len(group) - 1))
        out.append(Session(group[0].session_id, tuple(planned)))
    return out


def prefill_sessions(turns: Sequence[SourceTurn], config: LoadConfig, codec: Codec) -> list[Session]:
    """Prefill-heavy sessions: head + newest part of each turn's context, short answers."""
    total = config.prefill_prompt_tokens - TEMPLATE_TOKENS
    out = []
    for group in by_session(turns):
        planned = []
        for i, t in enumerate(group):
            head, rest = codec.cut(t.prompt, config.prefill_head_tokens, total)
            answer = max(1, min(codec.count(t.completion), config.prefill_output_max))
            planned.append(Turn(rest, answer, min(t.gap_s, config.max_gap_s), i == len(group) - 1, head))
        out.append(Session(group[0].session_id, tuple(planned)))
    return out


def phase_sequence(config: LoadConfig, cycles: int | None) -> Iterator[tuple[int, PhaseKind]]:
    """(1-based phase number, kind): the configured kinds, `cycles` times (None: forever)."""
    n = 0
    rounds = 0
    while cycles is None or rounds < cycles:
        for kind in config.phases:
            n += 1
            yield n, kind
        rounds += 1


@dataclass
class SessionDeck:
    """Sessions handed to agents in a shuffled, repeating order."""

    sessions: list[Session]
    rng: random.Random
    _order: list[int] = field(default_factory=list)

    def next(self) -> Session:
        if not self.sessions:
            raise ValueError("no sessions to replay")
        if not self._order:
            self._order = list(range(len(self.sessions)))
            self.rng.shuffle(self._order)
        return self.sessions[self._order.pop()]


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def fmt_s(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
