"""The agent load of `bench chaos` and how its streams are scored.

Each agent is a multi-turn branch (streaming, greedy, `X-Branch-ID` /
`X-Session-ID`, the last turn `X-Branch-Finished`; every fourth agent forks a
two-turn sub-agent with `X-Parent-Branch-ID`). A stream either finished with
a finish_reason and a usage chunk (completed), or raised an OpenAI-shaped
error (failed); anything else is `lost`. Completed text is compared with
the reference token by token (difflib on re-encoded ids: inserted tokens
count as duplicated, deleted as missing, replaced as mismatched).
"""

from __future__ import annotations

import asyncio
import difflib
from collections import Counter
from dataclasses import dataclass
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


@dataclass
class Outcome:
    status: str  # completed | failed | lost
    text: str = ""
    finish: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


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
            extra_headers=headers,
        )
        async for chunk in stream:
            if chunk.usage is not None:
                out.usage = chunk.usage.model_dump()
            for c in chunk.choices:
                out.text += c.delta.content or ""
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


def compare(tokenizer: Any, ref: str, got: str) -> tuple[int, int, int]:
    """(duplicated, missing, mismatched) tokens of `got` against `ref`."""
    if ref == got:
        return 0, 0, 0
    a = tokenizer.encode_text(ref, add_special_tokens=False)
    b = tokenizer.encode_text(got, add_special_tokens=False)
    dup = miss = wrong = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "insert":
            dup += j2 - j1
        elif op == "delete":
            miss += i2 - i1
        elif op == "replace":
            wrong += max(i2 - i1, j2 - j1)
    return dup, miss, wrong


def score(
    tokenizer: Any, reference: dict[tuple[str, int], Outcome], results: dict[tuple[str, int], Outcome]
) -> dict[str, Any]:
    counts = Counter(o.status for o in results.values())
    dup = miss = wrong = mismatched = usage_bad = 0
    errors: Counter[str] = Counter()
    shaped = True
    completion_tokens = 0
    for (branch, turn), got in results.items():
        ref = reference[(branch.removeprefix("healed/"), turn)]
        if got.status == "failed":
            errors[str((got.error or {}).get("code") or (got.error or {}).get("type"))] += 1
            shaped = shaped and {"message", "type"} <= set(got.error or {})
        if got.status != "completed":
            continue
        d, m, w = compare(tokenizer, ref.text, got.text)
        dup, miss, wrong = dup + d, miss + m, wrong + w
        mismatched += bool(d or m or w)
        assert got.usage is not None and ref.usage is not None
        completion_tokens += got.usage["completion_tokens"]
        usage_bad += (
            got.usage["completion_tokens"] != ref.usage["completion_tokens"]
            or got.usage["prompt_tokens"] != ref.usage["prompt_tokens"]
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
        "usage_mismatch": usage_bad,
        "errors": dict(errors),
        "errors_openai_shaped": shaped,
        "completion_tokens": completion_tokens,
        "lost_detail": [f"{b}#{t}: {o.error or o.finish}" for (b, t), o in results.items() if o.status == "lost"][:10],
    }
