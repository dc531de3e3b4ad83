"""Pure translations between the worker's wire fields and vLLM's: logprob
entries out of vLLM's per-position dicts, and whitespace bounds on the JSON
inside an xgrammar structural tag. No engine, no I/O."""

from __future__ import annotations

import json

from workers.protocol import TokenLogprobs


def token_logprobs(token_ids, positions, k: int) -> list[TokenLogprobs]:
    """vLLM's per-position `{token_id: Logprob}` dicts as wire entries.

    Each dict holds the k most likely tokens (ranks 1..k) and the sampled
    token, which has a rank beyond k when it is not among them.
    """
    out = []
    for token_id, position in zip(token_ids, positions or [], strict=False):
        sampled = position.get(token_id)
        top = sorted(
            ((t, lp) for t, lp in position.items() if lp.rank is not None and 1 <= lp.rank <= k),
            key=lambda item: item[1].rank,
        )
        out.append(
            TokenLogprobs(
                token_id=token_id,
                logprob=_finite(sampled.logprob) if sampled is not None else -9999.0,
                top=[(t, _finite(lp.logprob)) for t, lp in top],
            )
        )
    return out


def _finite(x: float) -> float:
    # -inf (a token the constraint or bias ruled out) is not valid JSON.
    return max(float(x), -9999.0)


def bound_tag_whitespace(structural_tag: str, limit: int = 1) -> str:
    """Give every JSON node of an xgrammar structural tag a whitespace bound.

    vLLM applies its `disable_any_whitespace` setting to JSON schemas but
    not to the JSON inside a structural tag (tool calls), where xgrammar
    then allows unbounded whitespace; `max_whitespace_cnt` (>= 1) bounds it.
    """
    tag = json.loads(structural_tag)

    def visit(node) -> None:
        if isinstance(node, dict):
            if node.get("type") == "json_schema":
                node["max_whitespace_cnt"] = limit
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(tag)
    return json.dumps(tag)
