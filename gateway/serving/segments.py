"""The pure core of one request's run across worker segments.

A request runs as one or more *segments*, each one worker call: a PREFILL
segment (disaggregated; one token, blocks published) or a DECODE segment
(stream to the end). `RequestProgress` holds what the request has produced
so far and decides, from plain values only, what happens next:

- `budget_spent()` / `next_call(role)`: whether `max_tokens` are all
  generated (finish LENGTH), else the continuation to send (context = prompt
  + generated, `max_tokens` reduced by what was generated).
- *Replay* (`replay=True`): a request whose sampling state lives inside the
  engine (a grammar, penalties over the generated tokens) cannot continue
  from prompt + generated. Each continuation reruns the original prompt
  with the full budget; its first tokens must equal what was generated
  (same seed, same logits) and are dropped, the rest continue the request.
  A mismatch is an error (`resume_mismatch`), never silently different
  output.
- `absorb(chunk_tokens, ...)`: the tokens of one chunk that the client gets
  (never more than the budget), first-token bookkeeping.
- `end_segment(outcome)`: what the segment's outcome means for the request:
  finished, decode next, or route again (with the limits on migrations and
  failed nodes enforced here, as typed errors). A failed node is skipped
  for the rest of the request; a node that only refused (it is switching
  phase) is skipped while another candidate is left (`skip()`), since its
  refusal says nothing about its health.

The orchestrator (`gateway.serving.orchestrator`) is the I/O shell around
it: routing lookups, worker calls, directory publishes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from core import FinishReason, Phase, Role
from gateway.http.errors import UpstreamFailed


class SegmentOutcome(enum.Enum):
    """How one segment ended."""

    FINISHED = "finished"  # stop, or length: the worker's output is complete
    GAVE_UP = "gave_up"  # migrated / abort: the node gave the request up (phase switch)
    NODE_FAILED = "node_failed"  # unreachable, a dead engine, or a stream cut without a finish
    REFUSED = "refused"  # turned down before it ran (the node is switching phase): no failure


class Next(enum.Enum):
    """What the request does after a segment."""

    DONE = "done"
    DECODE = "decode"  # a prefill segment returned its token: the decode runs next
    ROUTE_AGAIN = "route_again"  # continue elsewhere (migration, failover)


def segment_outcome(reason: FinishReason | None) -> SegmentOutcome | None:
    """The outcome a chunk's finish reason announces (None: the segment goes on).

    ERROR is not an outcome: a worker that failed the request is reported
    to the client (`UpstreamFailed`), never retried blindly.
    """
    if reason is None:
        return None
    if reason.ends_request:
        return SegmentOutcome.FINISHED
    if reason.resumable:
        return SegmentOutcome.GAVE_UP
    raise ValueError(f"{reason} is not a segment outcome")


@dataclass
class RequestProgress:
    """What one request has produced across its segments (mutable, no I/O)."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    max_node_failures: int
    max_migrations: int
    generated: list[int] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)  # nodes that failed this request
    refused: set[str] = field(default_factory=set)  # nodes that turned it down since the last reset
    refusals: int = 0
    max_refusals: int = 32
    refusal_rounds: int = 0  # times every candidate had refused and all were asked again
    nodes: list[str] = field(default_factory=list)  # node of each segment, in order
    failures: int = 0
    migrations: int = 0
    resumes: int = 0  # segments after the first one that had to be routed again
    cached: int | None = None  # prompt tokens served from cache (set by the first segment that says)
    ttft_s: float = 0.0
    first_phase: Phase | None = None
    just_prefilled: bool = False
    finish: FinishReason = FinishReason.LENGTH
    replay: bool = False  # continuations rerun the prompt (see the module docstring)
    replayed: int = 0  # tokens of the current segment matched against `generated` so far

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.generated)

    @property
    def first_segment(self) -> bool:
        return not self.nodes

    def context(self) -> list[int]:
        """The prompt of the next worker call."""
        return self.prompt if self.replay else self.prompt + self.generated

    @property
    def carried(self) -> int:
        """Generated tokens the next call's prompt already contains."""
        return 0 if self.replay else len(self.generated)

    def skip(self, candidates: set[str]) -> set[str]:
        """Nodes the next routing skips among `candidates` (the healthy
        nodes): every failed one; the refusing ones too unless that leaves
        none, when they are asked again (their phase may have changed)."""
        failed = self.excluded & candidates
        if self.refused and not candidates - failed - self.refused:
            self.refused.clear()
            self.refusal_rounds += 1
        return failed | (self.refused & candidates)

    def readmit(self, node_id: str) -> None:
        """A node this request failed on is routable for it again (it came back as a new incarnation)."""
        self.excluded.discard(node_id)

    def budget_spent(self) -> bool:
        """Every token `max_tokens` allows was generated: the request ends "length"."""
        if self.remaining > 0:
            return False
        self.finish = FinishReason.LENGTH
        return True

    def next_call(self, role: Role) -> tuple[str, int]:
        """(segment request id, max_tokens) of the next worker call."""
        if role is Role.PREFILL:
            return f"{self.request_id}.{len(self.nodes) + 1}", 1
        return f"{self.request_id}.{len(self.nodes) + 1}", self.max_tokens - self.carried

    def started(self, node_id: str) -> None:
        self.nodes.append(node_id)
        self.replayed = 0

    def absorb(
        self, token_ids: list[int], *, cached_tokens: int, finish: FinishReason | None, role: Role, elapsed_s: float
    ) -> tuple[int, list[int]]:
        """(offset, tokens): the chunk's tokens the client gets, cut to the
        budget, and where they start in `token_ids` (a replay drops the
        tokens already generated). Raises `UpstreamFailed` when a replay
        diverges from what the client already has."""
        if self.cached is None and (token_ids or (finish is not None and finish.ends_request)):
            self.cached = cached_tokens
        start = 0
        if self.replay:
            while start < len(token_ids) and self.replayed < len(self.generated):
                if token_ids[start] != self.generated[self.replayed]:
                    raise UpstreamFailed(
                        f"request {self.request_id} could not be resumed identically after {len(self.generated)} "
                        "tokens (its structured output or penalties depend on every token so far)",
                        code="resume_mismatch",
                    )
                start += 1
                self.replayed += 1
        tokens = token_ids[start : start + self.max_tokens - len(self.generated)]  # `remaining`, no call a token
        if tokens:
            if not self.generated:
                self.ttft_s, self.first_phase = elapsed_s, role.phase
            self.generated.extend(tokens)
            self.replayed = len(self.generated)
        return start, tokens

    def end_segment(
        self,
        outcome: SegmentOutcome,
        role: Role,
        *,
        reason: FinishReason | None = None,
        node_id: str = "",
        error: str = "",
    ) -> Next:
        """Apply a segment's outcome; raises `UpstreamFailed` when a limit is reached."""
        if outcome is SegmentOutcome.FINISHED:
            assert reason is not None and reason.ends_request
            self.finish = reason
            if reason is FinishReason.STOP or role is Role.DECODE:
                return Next.DONE
            self.just_prefilled = True  # the prefill's one token: decode next
            return Next.DECODE
        self.resumes += 1
        if outcome is SegmentOutcome.REFUSED:
            self.refusals += 1
            if self.refusals > self.max_refusals:
                raise UpstreamFailed(
                    f"request {self.request_id} was turned down {self.refusals} times by workers changing phase; "
                    f"last: {error}",
                    code="workers_refused",
                )
            self.refused.add(node_id)
            return Next.ROUTE_AGAIN
        if outcome is SegmentOutcome.GAVE_UP:
            # The node gave the request up; where it continues is routed
            # afresh (its KV, if saved, is already published).
            self.just_prefilled = False
            self.migrations += 1
            if self.migrations > self.max_migrations:
                raise UpstreamFailed(f"request {self.request_id} migrated too often", code="too_many_migrations")
            return Next.ROUTE_AGAIN
        # A failed node: skip it for this request. `just_prefilled` stays: a
        # decode that failed after its prefill still needs only a decode.
        self.excluded.add(node_id)
        self.failures += 1
        if self.failures >= self.max_node_failures:
            raise UpstreamFailed(
                f"request {self.request_id} failed on {self.failures} workers after {len(self.generated)} "
                f"tokens; last error: {error}",
                code="workers_failed",
            )
        return Next.ROUTE_AGAIN
