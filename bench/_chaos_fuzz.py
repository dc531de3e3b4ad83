"""Harness-shaped fuzzing of the gateway for `bench chaos` (hypothesis).

Bodies shaped like what agent harnesses send to `/v1/chat/completions`:
content-part lists, assistant tool-call turns and tool results, tools with
`tool_choice`, `response_format` grammars, long prompts (over the
chunked-prefill budget) with a grammar, and sampling fields at their
bounds. Every answer must be a 2xx or a 4xx that names the problem; a 5xx
counts unless it is a quarantined poison request (`request_quarantined`).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

WORDS = ["read", "file", "src/app.py", "tests", "fix", "the", "cache", "key", "tenant", "diff", "error", "ok"]

text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join)
parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, text), min_size=1, max_size=3)
user_content = st.one_of(text, parts)
TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def _tool_turn(call_id: int, path: str) -> list[dict[str, Any]]:
    cid, args = f"call_{call_id}", json.dumps({"path": path})
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": "read_file", "arguments": args}}],
        },
        {"role": "tool", "tool_call_id": cid, "content": f"contents of {path}: ok"},
    ]


@st.composite
def chat_body(draw: st.DrawFn, model: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(text)}]
    messages.append({"role": "user", "content": draw(user_content)})
    if draw(st.booleans()):
        messages += _tool_turn(draw(st.integers(0, 99)), draw(st.sampled_from(["a.py", "b/c.md", "x.txt"])))
        messages.append({"role": "user", "content": draw(user_content)})
    if draw(st.integers(0, 5)) == 0:  # a long prompt: more than one prefill chunk
        rng = random.Random(draw(st.integers(0, 10_000)))
        messages.append({"role": "user", "content": " ".join(f"w{rng.randrange(100_000)}" for _ in range(560))})
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": draw(st.sampled_from([1, 8, 16]))}
    body["temperature"] = draw(st.sampled_from([0.0, 0.7, 2.0]))
    for key, values in (
        ("top_p", [1.0, 0.01]),
        ("top_k", [-1, 0, 1, 50]),
        ("min_p", [0.0, 1.0]),
        ("presence_penalty", [-2.0, 2.0]),
        ("frequency_penalty", [-2.0, 2.0]),
        ("seed", [0, 2**63 - 1]),
        ("n", [1, 2]),
        ("stop", [["\n"], ["}"]]),
        ("logprobs", [True]),
    ):
        if draw(st.booleans()):
            body[key] = draw(st.sampled_from(values))
    if body.get("logprobs"):
        body["top_logprobs"] = draw(st.sampled_from([0, 5, 20]))
    choice = draw(st.sampled_from(["none", "json_object", "json_schema", "tools_auto", "tools_required"]))
    if choice == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif choice == "json_schema":
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    elif choice.startswith("tools"):
        body["tools"] = [TOOL]
        body["tool_choice"] = choice.removeprefix("tools_")
    if draw(st.booleans()):
        body["stream"] = True
    return body


def fuzz(gateway_url: str, api_key: str, model: str, cases: int) -> dict[str, Any]:
    """Send `cases` generated bodies; counts by status, and the 5xx that are not quarantined."""
    statuses: Counter[int] = Counter()
    bad: list[str] = []
    client = httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=300)

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=chat_body(model))
    def one(body: dict[str, Any]) -> None:
        r = client.post("/v1/chat/completions", json=body)
        text = r.text if not body.get("stream") else r.read().decode(errors="replace")
        status = r.status_code
        if status == 200 and body.get("stream") and '"error":' in text:
            status = 599  # an error event inside a stream: counted as a server error
        statuses[status] += 1
        if status >= 500 and "request_quarantined" not in text:
            bad.append(f"{status}: {text[:300]} <- {json.dumps(body)[:300]}")

    try:
        one()
    finally:
        client.close()
    n5 = sum(v for k, v in statuses.items() if k >= 500)
    return {
        "fuzz_cases": sum(statuses.values()),
        "fuzz_5xx": len(bad),
        "fuzz_quarantined": n5 - len(bad),
        "fuzz_statuses": dict(statuses),
        "fuzz_5xx_detail": bad[:5],
    }
