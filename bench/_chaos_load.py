"""The agent load of `bench chaos` and how its streams are scored.

Each agent is a multi-turn branch (streaming, greedy, `X-Branch-ID` /
`X-Session-ID`, the last turn `X-Branch-Finished`; every fourth agent forks a
two-turn sub-agent with `X-Parent-Branch-ID`). A stream either finished with
a finish_reason and a usage chunk (completed), or raised an OpenAI-shaped
error (failed); anything else is `lost`.

Completed streams are compared with the reference token by token, on the
tokens the stream itself reported (`logprobs` with the top 2 per token):

- Up to the first token where they differ the two agree. From there on
  the output is conditioned on a different token, so what follows is not
  a fault's doing token by token: it is counted by difflib only when the
  first difference is not a *near tie*.
- A near tie: the other run's token was the runner-up within `TIE_NATS`
  of the chosen one, in both runs' distributions at that position. Greedy
  argmax then follows float rounding, which differs with the batch a
  request ran in and with KV computed in a prefill against a decode, even
  in float32 (measured: a fault-free second pass of the reference prompts
  differed on 3 of 210 requests, all a digit flipped). Such a request
  counts as `tie_flips`, with its gap, never as duplicated.
- Otherwise difflib on the token sequences: inserted tokens count as
  duplicated, deleted as missing, replaced as mismatched. A duplicate
  that a resume sends twice lands here: a repeated token is the chosen
  one of an earlier position, not the runner-up of this one.
"""

from __future__ import annotations

import asyncio
import difflib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.chaos_bench import ChaosConfig


@dataclass(frozen=True)
class Agent:
    branch: str
    session: str
    parent: str | None
    task: str
    turns: int


TIE_NATS = 0.02  # a first difference within this logprob gap is a near tie (see the module docstring)


@dataclass(frozen=True)
class Tok:
    """One streamed token: its text, logprob and the top alternatives' logprobs."""

    token: str
    logprob: float
    top: dict[str, float]


@dataclass
class Outcome:
    status: str  # completed | failed | lost
    text: str = ""
    tokens: list[Tok] = field(default_factory=list)
    finish: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class AgentClients:
    """The agents' OpenAI clients of one event loop (`clients(api_key,
    retries)`), closed together by `aclose` before that loop ends: an
    unclosed client's finalizer needs a live loop."""

    def __init__(self, base_url: Callable[[], str], served_model: str, timeout_s: float) -> None:
        self._base_url, self._served_model, self._timeout_s = base_url, served_model, timeout_s
        self._made: list[Any] = []

    def __call__(self, api_key: str, retries: int = 0) -> Any:
        import openai

        c = openai.AsyncOpenAI(
            base_url=f"{self._base_url()}/v1", api_key=api_key, max_retries=retries, timeout=self._timeout_s
        )
        c.served_model = self._served_model  # type: ignore[attr-defined]  # the agents read the model off their client
        self._made.append(c)
        return c

    async def aclose(self) -> None:
        made, self._made = self._made, []
        await asyncio.gather(*(c.close() for c in made), return_exceptions=True)


def agents(cfg: ChaosConfig) -> list[Agent]:
    out = []
    for s in range(cfg.sessions):
        task = f"Agent {s}: refactor module m{s} so its cache keys include the tenant; run the tests."
        out.append(Agent(f"agent-{s}", f"run-{s}", None, task, cfg.turns))
        if s % 4 == 0:
            out.append(Agent(f"agent-{s}-sub", f"run-{s}", f"agent-{s}", f"Sub-agent of {s}: read file f{s}.py", 2))
    return out


def tool_result(agent: Agent, turn: int) -> str:
    return f"Tool result {turn} for {agent.branch}: exit code {turn % 3}, {10 + turn} lines of output."


async def stream_one(
    client: Any, cfg: ChaosConfig, agent: Agent, messages: list[dict[str, str]], last: bool
) -> Outcome:
    import openai

    headers = {"X-Branch-ID": agent.branch, "X-Session-ID": agent.session}
    if agent.parent:
        headers["X-Parent-Branch-ID"] = agent.parent
    if last:
        headers["X-Branch-Finished"] = "true"
    out = Outcome("lost")
    try:
        stream = await client.chat.completions.create(
            model=client.served_model,
            messages=messages,
            max_tokens=cfg.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            top_logprobs=2,  # the runner-up tells a near tie from a fault (see `compare`)
            extra_headers=headers,
        )
        async for chunk in stream:
            if chunk.usage is not None:
                out.usage = chunk.usage.model_dump()
            for c in chunk.choices:
                out.text += c.delta.content or ""
                for t in (c.logprobs.content or []) if c.logprobs is not None else []:
                    out.tokens.append(Tok(t.token, t.logprob, {a.token: a.logprob for a in t.top_logprobs}))
                out.finish = c.finish_reason or out.finish
    except (openai.APIConnectionError, openai.APITimeoutError) as exc:
        out.error = {"client": type(exc).__name__}  # no answer from the gateway: lost
        return out
    except openai.APIError as exc:
        out.status = "failed"
        out.error = exc.body if isinstance(exc.body, dict) else {"message": str(exc), "body": repr(exc.body)}
        out.error = out.error.get("error", out.error) if isinstance(out.error.get("error"), dict) else out.error
        return out
    if out.finish is not None and out.usage is not None:
        out.status = "completed"
    return out


async def run_agents(
    client: Any, cfg: ChaosConfig, plan: list[Agent], reference: dict[tuple[str, int], Outcome] | None
) -> dict[tuple[str, int], Outcome]:
    """Every agent's turns in order, agents concurrently. With `reference`,
    assistant turns are the reference answers (so every prompt is known)."""
    results: dict[tuple[str, int], Outcome] = {}

    async def one(agent: Agent) -> None:
        messages = [
            {"role": "system", "content": "You are a coding agent. Be terse."},
            {"role": "user", "content": agent.task},
        ]
        for turn in range(agent.turns):
            got = await stream_one(client, cfg, agent, messages, last=turn == agent.turns - 1)
            results[(agent.branch, turn)] = got
            answer = reference[(agent.branch, turn)].text if reference is not None else got.text
            messages = messages + [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": tool_result(agent, turn)},
            ]
            await asyncio.sleep(cfg.tool_time_s)

    await asyncio.gather(*(one(a) for a in plan))
    return results


@dataclass(frozen=True)
class Diff:
    """How a completed stream differs from the reference (all 0: identical)."""

    duplicated: int = 0
    missing: int = 0
    mismatched: int = 0
    tie_at: int | None = None  # the first difference, a near tie, at this token
    tie_gap: float | None = None  # its logprob gap (nats)
    first_diff: int | None = None  # position of the first differing token

    @property
    def counted(self) -> bool:
        return bool(self.duplicated or self.missing or self.mismatched)


def tie_gap(ref: Tok, got: Tok) -> float | None:
    """The larger of the two runs' gaps between the chosen token and the
    other run's token at one position; None when either run did not list
    the other's token among its top alternatives."""
    gaps = []
    for mine, other in ((ref, got), (got, ref)):
        if other.token not in mine.top:
            return None
        gaps.append(max(mine.logprob, *mine.top.values()) - mine.top[other.token])
    return max(gaps)


def compare_tokens(ref: list[Tok], got: list[Tok], tie_nats: float = TIE_NATS) -> Diff:
    """`got` against `ref`, token by token (see the module docstring)."""
    a, b = [t.token for t in ref], [t.token for t in got]
    if a == b:
        return Diff()
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if first < min(len(a), len(b)):
        gap = tie_gap(ref[first], got[first])
        if gap is not None and gap <= tie_nats:
            return Diff(tie_at=first, tie_gap=round(gap, 6), first_diff=first)
    dup, miss, wrong = _difflib_counts(a, b)
    return Diff(dup, miss, wrong, first_diff=first)


def _difflib_counts(a: list[Any], b: list[Any]) -> tuple[int, int, int]:
    dup = miss = wrong = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "insert":
            dup += j2 - j1
        elif op == "delete":
            miss += i2 - i1
        elif op == "replace":
            wrong += max(i2 - i1, j2 - j1)
    return dup, miss, wrong


def compare(tokenizer: Any, ref: Outcome, got: Outcome) -> Diff:
    """`compare_tokens` on the streamed tokens; a stream that reported none
    (a text-only answer) is compared on re-encoded ids, with no tie test."""
    if ref.text == got.text and [t.token for t in ref.tokens] == [t.token for t in got.tokens]:
        return Diff()
    if ref.tokens and got.tokens:
        return compare_tokens(ref.tokens, got.tokens)
    a = tokenizer.encode_text(ref.text, add_special_tokens=False)
    b = tokenizer.encode_text(got.text, add_special_tokens=False)
    dup, miss, wrong = _difflib_counts(a, b)
    return Diff(dup, miss, wrong)


def _around(o: Outcome, at: int) -> str:
    return "".join(t.token for t in o.tokens[max(0, at - 3) : at + 4])


def score(
    tokenizer: Any, reference: dict[tuple[str, int], Outcome], results: dict[tuple[str, int], Outcome]
) -> dict[str, Any]:
    counts = Counter(o.status for o in results.values())
    dup = miss = wrong = mismatched = usage_bad = 0
    errors: Counter[str] = Counter()
    shaped = True
    completion_tokens = 0
    ties: list[float] = []
    detail: list[str] = []
    for (branch, turn), got in results.items():
        ref = reference[(branch.removeprefix("healed/"), turn)]
        if got.status == "failed":
            errors[str((got.error or {}).get("code") or (got.error or {}).get("type"))] += 1
            shaped = shaped and {"message", "type"} <= set(got.error or {})
        if got.status != "completed":
            continue
        d = compare(tokenizer, ref, got)
        dup, miss, wrong = dup + d.duplicated, miss + d.missing, wrong + d.mismatched
        mismatched += d.counted
        if d.tie_gap is not None:
            ties.append(d.tie_gap)
        if d.counted and len(detail) < 10:
            at = d.first_diff or 0
            detail.append(f"{branch}#{turn} @{at}: ref {_around(ref, at)!r} got {_around(got, at)!r}")
        assert got.usage is not None and ref.usage is not None
        completion_tokens += got.usage["completion_tokens"]
        # A near tie leads to another continuation, which may stop elsewhere.
        usage_bad += got.usage["prompt_tokens"] != ref.usage["prompt_tokens"] or (
            d.tie_at is None and got.usage["completion_tokens"] != ref.usage["completion_tokens"]
        )
    return {
        "sent": len(results),
        "completed": counts["completed"],
        "failed": counts["failed"],
        "lost": counts["lost"],
        "duplicated_tokens": dup,
        "missing_tokens": miss,
        "mismatched_tokens": wrong,
        "mismatched_requests": mismatched,
        "tie_flips": len(ties),
        "tie_flip_gaps": sorted(ties),
        "mismatch_detail": detail,
        "usage_mismatch": usage_bad,
        "errors": dict(errors),
        "errors_openai_shaped": shaped,
        "completion_tokens": completion_tokens,
        "lost_detail": [f"{b}#{t}: {o.error or o.finish}" for (b, t), o in results.items() if o.status == "lost"][:10],
    }
