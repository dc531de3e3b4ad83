"""Every new request field over real HTTP, in front of fake workers: bad
input is a 400 naming the field (Anthropic-shaped on /v1/messages), good
input reaches the worker as it should (n jobs with seed + i, logprobs,
penalties replayed across a migration), the Responses store and branch
identity, the OpenAPI document.

The fake workers' "model" is a deterministic function of the context
(testing.fake_worker), so outputs can be compared exactly; it does not
honour constraints (that is vLLM's job: test_agent_clients_vllm.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputParam

from core import Phase, Role
from gateway.app import create_app
from gateway.serving.tokenize import PromptTokenizer
from gateway.settings import GatewaySettings
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.replica_cluster import clear_redis_prefix, redis_available
from testing.stacks import control_plane_stack, serve

MSG: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Agents call tools, read their results and continue the conversation."}
]


def error_body(exc: openai.APIStatusError) -> dict[str, Any]:
    """The error object the gateway answered with (the SDK types the body loosely)."""
    assert isinstance(exc.body, dict), exc.body
    return exc.body


TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


class Stack:
    def __init__(self, url: str, workers: list[FakeWorker], app) -> None:
        self.url, self.workers, self.app = url, workers, app
        self.client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        self.http = httpx.AsyncClient(base_url=url, timeout=30)

    @property
    def runtime(self):
        return self.app.state.runtime


@contextlib.asynccontextmanager
async def stack(
    tokenizer: PromptTokenizer, phases: list[Phase], *, delay: float = 0.0, max_model_len: int = 0, **settings
) -> AsyncIterator[Stack]:
    workers = []
    urls = []
    async with contextlib.AsyncExitStack() as es:
        for i, phase in enumerate(phases):
            w = FakeWorker(
                f"w{i}",
                phase=phase,
                token_delay_s=delay,
                token_range=(10, tokenizer.vocab_size),
                max_model_len=max_model_len,
            )
            urls.append(await es.enter_async_context(serve(create_fake_worker_app(w))))
            workers.append(w)
        cfg = GatewaySettings(
            **{
                "model_name": "demo",
                "worker_urls": tuple(urls),
                "heartbeat_interval_s": 0.05,
                "local_prefill_max_tokens": 8,
                "block_size": 16,
                **settings,
            }
        )
        app = create_app(cfg, tokenizer=tokenizer)
        gw = await es.enter_async_context(serve(app))
        s = Stack(gw, workers, app)
        for _ in range(100):  # the heartbeat reports the workers' context length
            if len(phases) == s.runtime.registry.healthy_count():
                break
            await asyncio.sleep(0.02)
        try:
            yield s
        finally:
            await s.http.aclose()


CHAT_BAD = [
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"presence_penalty": 2.1}, "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # beyond the vocabulary
    ({"top_k": -5}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),  # needs logprobs: true
    ({"stop_token_ids": [99999999]}, "stop_token_ids"),
    ({"min_tokens": 10, "max_tokens": 5}, None),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
    ({"tools": [TOOL], "tool_choice": "bogus"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "zz"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": []}, "tools"),
    ({"response_format": {"type": "bogus"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"functions": []}, "functions"),
    ({"audio": {}}, "audio"),
    ({"guided_json": {}}, "guided_json"),
    ({"not_a_field": 1}, "not_a_field"),
]


@pytest.mark.parametrize(("extra", "param"), CHAT_BAD)
async def test_bad_chat_fields_are_400s_naming_them(tokenizer, extra, param):
    async with stack(tokenizer, [Phase.DECODE]) as s:
        r = await s.http.post("/v1/chat/completions", json={"model": "demo", "messages": MSG, **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
        if param is not None:
            assert err["param"] == param, err
        assert not s.workers[0].requests  # refused before any worker call


async def test_responses_and_messages_bad_fields(tokenizer):
    async with stack(tokenizer, [Phase.DECODE], max_model_len=500) as s:
        cases: list[tuple[dict[str, Any], str | None]] = [
            ({"background": True}, "background"),
            ({"tools": [{"type": "file_search"}]}, "tools.0.type"),
            ({"text": {"format": {"type": "json_schema"}}}, None),
            ({"max_output_tokens": 99999}, "max_output_tokens"),
            ({"max_output_tokens": 0}, "max_output_tokens"),
            ({"bogus": 1}, "bogus"),
        ]
        for extra, param in cases:
            r = await s.http.post("/v1/responses", json={"model": "demo", "input": "hi", **extra})
            assert r.status_code == 400, (extra, r.text)
            if param is not None:
                assert r.json()["error"]["param"] == param, r.text
        body = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        for extra in (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048},
            {"bogus": 1},
            {"max_tokens": 0},
            {"temperature": 3},
            {"top_k": -5},
            {"tool_choice": {"type": "bogus"}},
            {"tool_choice": {"type": "any"}},  # no tools
            {"tool_choice": {"type": "tool", "name": "zz"}, "tools": [{"name": "add", "input_schema": {}}]},
            {"tools": [{"name": "a b", "input_schema": {"type": "object"}}]},
            {"messages": [{"role": "user", "content": [image]}]},
        ):
            r = await s.http.post("/v1/messages", json={**body, **extra})
            assert r.status_code == 400 and r.json()["type"] == "error", (extra, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"
        r = await s.http.post("/v1/messages", json={**body, "messages": [{"role": "user", "content": [image]}]})
        assert r.json()["error"]["message"].startswith("content of type 'image' "), r.text  # not vLLM's image_url
        r = await s.http.post("/v1/messages", json={**body, "model": "nope"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert not s.workers[0].requests


async def test_n_choices_run_as_jobs_with_consecutive_seeds(tokenizer):
    async with stack(tokenizer, [Phase.DECODE]) as s:
        r = await s.client.chat.completions.create(
            model="demo", messages=MSG, max_tokens=5, n=3, seed=40, logprobs=True, top_logprobs=2
        )
        assert [c.index for c in r.choices] == [0, 1, 2]
        seeds = sorted(seed for req in s.workers[0].requests if (seed := req.sampling.seed) is not None)
        assert seeds == [40, 41, 42]
        for c in r.choices:
            assert c.logprobs is not None and c.logprobs.content is not None
            assert len(c.logprobs.content) == 5
            assert all(
                e.logprob == -0.5 and [t.logprob for t in e.top_logprobs] == [-0.5, -1.5] for e in c.logprobs.content
            )
        assert r.usage is not None
        assert (
            r.usage.completion_tokens == 15
            and r.usage.prompt_tokens == s.workers[0].requests[0].prompt_token_ids.__len__()
        )
        chunks = [
            c
            async for c in await s.client.chat.completions.create(
                model="demo", messages=MSG, max_tokens=3, n=2, stream=True
            )
        ]
        per_choice = {
            i: "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices and ch.choices[0].index == i)
            for i in (0, 1)
        }
        assert all(per_choice.values()) and {
            ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason
        } == {"length"}


async def test_completions_logprobs_in_the_legacy_shape(tokenizer):
    async with stack(tokenizer, [Phase.DECODE]) as s:
        r = await s.client.completions.create(
            model="demo", prompt="Prefill computes the prompt", max_tokens=4, logprobs=2
        )
        lp = r.choices[0].logprobs
        assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
        assert lp.top_logprobs is not None and lp.text_offset is not None
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
        assert lp.text_offset[0] == 0 and all(len(t) <= 2 for t in lp.top_logprobs)


async def test_default_max_tokens_is_what_the_context_leaves(tokenizer):
    async with stack(tokenizer, [Phase.DECODE], max_model_len=120) as s:
        r = await s.client.chat.completions.create(model="demo", messages=MSG)
        assert r.usage is not None
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 120 and r.choices[0].finish_reason == "length"
        with pytest.raises(openai.BadRequestError) as err:
            await s.client.chat.completions.create(model="demo", messages=MSG, max_completion_tokens=200)
        body = error_body(err.value)
        assert body["code"] == "context_length_exceeded" and body["param"] == "max_completion_tokens"
        assert "maximum context length is 120 tokens" in body["message"] and "worker" not in body["message"]


async def test_penalised_request_is_replayed_across_the_prefill_decode_hand_off_and_a_switch(tokenizer):
    async with stack(tokenizer, [Phase.PREFILL, Phase.DECODE, Phase.DECODE], delay=0.004) as s:
        body: dict[str, Any] = {
            "model": "demo",
            "messages": MSG,
            "max_tokens": 40,
            "temperature": 0,
            "presence_penalty": 0.5,
        }
        baseline = (await s.client.chat.completions.create(**body)).choices[0].message.content
        decodes = [r for w in s.workers[1:] for r in w.requests if r.role is Role.DECODE]
        # the decode node got the original prompt and the whole budget (not prompt + the prefill's token)
        assert decodes and len(decodes[0].prompt_token_ids) == len(s.workers[0].requests[0].prompt_token_ids)
        assert decodes[0].sampling.max_tokens == 40
        for w in s.workers:
            w.requests.clear()
        stream = await s.client.chat.completions.create(**body, stream=True)
        text = ""
        switched = False
        async for chunk in stream:
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""
            if not switched and len(text) > 5:
                switched = True
                busy = next(w for w in s.workers[1:] if any(r.role is Role.DECODE for r in w.requests))
                await s.runtime.cluster.switch(busy.node_id, "prefill", reason="test", who="pytest")
        assert switched and text == baseline  # replayed on the other node, no gap, no duplicate


async def test_responses_chain_store_and_branch(tokenizer):
    async with stack(tokenizer, [Phase.DECODE]) as s:
        first = await s.client.responses.create(
            model="demo", input="first turn", instructions="be brief", max_output_tokens=4
        )
        second = await s.client.responses.create(
            model="demo", input="second turn", previous_response_id=first.id, max_output_tokens=4
        )
        prompts = [r.prompt_token_ids for r in s.workers[0].requests]
        # turn 2's prompt continues turn 1's conversation (its input and its output)
        assert tokenizer.decode(prompts[1]).count("first turn") == 1 and "second turn" in tokenizer.decode(prompts[1])
        assert "be brief" not in tokenizer.decode(prompts[1])  # instructions do not carry over
        branches = {r.branch_id for r in s.workers[0].requests}
        assert len(branches) == 1  # one conversation, one branch
        got = await s.http.get(f"/v1/responses/{second.id}")
        assert got.status_code == 200 and got.json()["id"] == second.id
        unstored = await s.client.responses.create(model="demo", input="x", store=False, max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            await s.client.responses.create(model="demo", input="y", previous_response_id=unstored.id)
        assert (await s.http.delete(f"/v1/responses/{first.id}")).status_code == 200
        with pytest.raises(openai.NotFoundError) as err:  # the chain lost its first link
            await s.client.responses.create(model="demo", input="z", previous_response_id=second.id)
        assert error_body(err.value)["code"] == "previous_response_not_found"


@pytest.mark.redis
async def test_stored_responses_stay_in_their_redis_prefix(tokenizer):
    """Two clusters on one Redis (different EVOLVING_REDIS_PREFIX): neither sees the other's stored turns."""
    url = "redis://127.0.0.1:6379/0"
    if not redis_available(url):
        pytest.skip("no Redis server on 127.0.0.1:6379")
    prefixes = [f"ei-test-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    try:
        async with (
            stack(tokenizer, [Phase.DECODE], directory_url=url, redis_prefix=prefixes[0]) as a,
            stack(tokenizer, [Phase.DECODE], directory_url=url, redis_prefix=prefixes[1]) as b,
        ):
            first = await a.client.responses.create(model="demo", input="first turn", max_output_tokens=4)
            assert (await a.http.get(f"/v1/responses/{first.id}")).status_code == 200
            assert (await b.http.get(f"/v1/responses/{first.id}")).status_code == 404
            with pytest.raises(openai.NotFoundError) as err:
                await b.client.responses.create(model="demo", input="more", previous_response_id=first.id)
            assert error_body(err.value)["code"] == "previous_response_not_found"
            with redis.Redis.from_url(url, decode_responses=True) as r:
                stored = [list(r.scan_iter(match="{" + p + "}:responses:*")) for p in prefixes]
            assert [k.endswith(":" + first.id) for k in stored[0]] == [True] and stored[1] == [], stored
    finally:
        for p in prefixes:
            clear_redis_prefix(url, "{" + p + "}")


async def test_a_resent_history_stays_on_one_branch(tokenizer):
    async with stack(tokenizer, [Phase.DECODE]) as s:
        history: ResponseInputParam = [{"role": "system", "content": "sys"}, {"role": "user", "content": "start"}]
        for turn in range(2):
            r = await s.client.responses.create(model="demo", input=history, max_output_tokens=2)
            history += [{"role": "assistant", "content": r.output_text}, {"role": "user", "content": f"more {turn}"}]
        ac = anthropic.AsyncAnthropic(base_url=s.url, api_key="x", max_retries=0)
        msgs: list[MessageParam] = [{"role": "user", "content": "start"}]
        await ac.messages.create(model="demo", max_tokens=2, system="other", messages=msgs)
        await ac.messages.create(
            model="demo",
            max_tokens=2,
            system="other",
            messages=[*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}],
        )
        branches = [r.branch_id for r in s.workers[0].requests]
        assert len(set(branches[:2])) == 1 and len(set(branches[2:])) == 1 and branches[0] != branches[2]
        await ac.messages.create(
            model="demo", max_tokens=2, messages=msgs, extra_headers={"X-Claude-Code-Session-Id": "abc-123"}
        )
        assert s.workers[0].requests[-1].branch_id not in branches


def test_anthropic_auth_takes_x_api_key_and_bearer(tmp_path):
    with control_plane_stack(tmp_path) as st:
        key = st.tenant("ant")
        body = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        for headers in ({"x-api-key": key}, {"Authorization": f"Bearer {key}"}):
            r = httpx.post(st.url + "/v1/messages", json=body, headers=headers, timeout=30)
            assert r.status_code == 200 and r.json()["type"] == "message", r.text
        for headers in ({}, {"x-api-key": "sk-wrong-key-000000"}):
            r = httpx.post(st.url + "/v1/messages", json=body, headers=headers, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text


def test_every_v1_route_documents_its_body_and_security(tokenizer):
    app = create_app(GatewaySettings(model_name="demo"), tokenizer=tokenizer)
    doc = app.openapi()
    for path, ops in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in ops.items():
            assert op.get("security"), (method, path)
            if method == "post" and "{" not in path:
                ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                assert ref.rsplit("/", 1)[-1] in doc["components"]["schemas"], (path, ref)
    assert {"TenantKey", "AnthropicKey"} <= set(doc["components"]["securitySchemes"])
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "response_format", "logit_bias", "n", "logprobs", "top_logprobs"} <= set(chat)
    responses = doc["components"]["schemas"]["ResponsesRequest"]["properties"]
    assert "previous_response_id" in responses and "request_id" not in responses  # refused fields are left out
