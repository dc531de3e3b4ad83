"""The gateway over real HTTP on localhost, in front of fake workers
(`testing.fake_worker_app`), driven by the official `openai` client.

No vLLM here: the fake workers speak the worker protocol with a
deterministic "model", which is what lets these tests assert exact tokens
across migrations and node deaths.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from core import Phase
from gateway.app import create_app
from gateway.serving.tokenize import PromptTokenizer
from gateway.settings import GatewaySettings
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.stacks import serve


class Stack:
    def __init__(self, gateway_url: str, workers: dict[str, FakeWorker], app) -> None:
        self.url = gateway_url
        self.workers = workers
        self.app = app
        self.client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="sk-test", max_retries=0)

    @property
    def runtime(self):
        return self.app.state.runtime


@contextlib.asynccontextmanager
async def stack(
    tokenizer: PromptTokenizer, phases: list[Phase], *, delay: float = 0.0, **settings
) -> AsyncIterator[Stack]:
    workers = {}
    vocab_hi = tokenizer.vocab_size
    async with contextlib.AsyncExitStack() as es:
        for i, phase in enumerate(phases):
            w = FakeWorker(f"w{i}", phase=phase, token_delay_s=delay, token_range=(10, vocab_hi))
            url = await es.enter_async_context(serve(create_fake_worker_app(w)))
            workers[url] = w
        cfg = GatewaySettings(
            model_name="demo",
            worker_urls=tuple(workers),
            heartbeat_interval_s=0.05,
            local_prefill_max_tokens=8,
            max_body_bytes=64 * 1024,
            **settings,
        )
        app = create_app(cfg, tokenizer=tokenizer)
        gw = await es.enter_async_context(serve(app, gateway_server=True))
        yield Stack(gw, workers, app)


MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Agents call tools, read their results and continue the conversation."},
]


async def test_openai_client_non_stream_and_stream(tokenizer):
    async with stack(tokenizer, [Phase.PREFILL, Phase.DECODE]) as s:
        models = await s.client.models.list()
        assert [m.id for m in models.data] == ["demo"]
        full = await s.client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=12, temperature=0)
        assert full.usage is not None and full.usage.prompt_tokens_details is not None
        assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 12
        assert full.usage.prompt_tokens_details.cached_tokens == 0
        stream = await s.client.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
        text, usage, finish = "", None, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert text == full.choices[0].message.content and finish == "length"
        assert usage is not None
        assert usage.completion_tokens == 12 and usage.prompt_tokens == full.usage.prompt_tokens
        comp = await s.client.completions.create(model="demo", prompt="Prefill computes the prompt", max_tokens=5)
        assert comp.usage is not None
        assert comp.choices[0].finish_reason == "length" and comp.usage.completion_tokens == 5


async def test_multi_turn_branch_cached_tokens_grow(tokenizer):
    async with stack(tokenizer, [Phase.PREFILL, Phase.DECODE]) as s:
        msgs = list(MESSAGES)
        cached: list[int] = []
        for turn in range(3):
            r = await s.client.chat.completions.create(
                model="demo", messages=msgs, max_tokens=8, extra_headers={"X-Branch-ID": "agent-1"}
            )
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            assert r.usage.prompt_tokens_details.cached_tokens is not None
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
            msgs += [
                {"role": "assistant", "content": r.choices[0].message.content or ""},
                {"role": "user", "content": f"Tool result {turn}: the weather is sunny."},
            ]
        assert cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1]
        directory = s.runtime.directory
        assert await directory.is_branch_active("default/agent-1")
        async with httpx.AsyncClient() as h:
            done = await h.post(f"{s.url}/v1/branches/agent-1/finish")
        assert done.status_code == 200 and done.json() == {"id": "agent-1", "object": "branch", "finished": True}
        assert not await directory.is_branch_active("default/agent-1")


async def test_finished_requests_carry_their_turn_gap_for_the_planner(tokenizer):
    """The planner's offered-mix weights need each request's response time and
    the gap since its branch's previous request (planner.offered)."""
    async with stack(tokenizer, [Phase.PREFILL, Phase.DECODE], planner="none") as s:
        for _ in range(3):
            await s.client.chat.completions.create(
                model="demo", messages=MESSAGES, max_tokens=4, extra_headers={"X-Branch-ID": "agent-gap"}
            )
            await asyncio.sleep(0.3)
        await s.client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=4)  # no branch
        samples = s.runtime.service.workload.peek()
        assert len(samples) == 4 and all(x.e2e_s is not None and x.e2e_s > 0 for x in samples)
        assert samples[0].gap_s is None and samples[3].gap_s is None  # first turn; one-shot request
        assert all(0.3 <= x.gap_s < 5.0 for x in samples[1:3])


async def test_switch_during_concurrent_streams_loses_nothing(tokenizer):
    async with stack(tokenizer, [Phase.DECODE, Phase.DECODE, Phase.DECODE], delay=0.004) as s:
        prompts: list[list[ChatCompletionMessageParam]] = [
            [{"role": "user", "content": f"Request number {i} about caching."}] for i in range(12)
        ]

        async def run(msgs: list[ChatCompletionMessageParam]) -> str:
            out = ""
            stream = await s.client.chat.completions.create(
                model="demo", messages=msgs, max_tokens=40, stream=True, temperature=0
            )
            async for chunk in stream:
                for c in chunk.choices:
                    out += c.delta.content or ""
            return out

        baseline = await asyncio.gather(*(run(m) for m in prompts))
        tasks = [asyncio.create_task(run(m)) for m in prompts]
        await asyncio.sleep(0.05)
        outcome = await s.runtime.cluster.switch("w0", Phase.PREFILL, reason="test", who="pytest")
        switched = await asyncio.gather(*tasks)
        assert outcome.outcome == "ok"
        assert switched == baseline


async def test_a_streams_tokens_take_the_lane_and_arrive_whole_and_in_order(tokenizer, monkeypatch):
    """Served as production serves it, a plain stream's tokens that arrive one
    a read are written from the worker read's callback (`PlainLane`); the
    text is the non-streamed answer's, the usage and the end as usual."""
    from gateway.serving.turn import lean

    taken: list[int] = []
    take = lean.PlainLane.__call__

    def counted(self, delta):
        taken.append(len(delta.token_ids))
        take(self, delta)

    monkeypatch.setattr(lean.PlainLane, "__call__", counted)
    async with stack(tokenizer, [Phase.DECODE], delay=0.004) as s:
        full = await s.client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=40, temperature=0)
        stream = await s.client.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=40, stream=True, stream_options={"include_usage": True}
        )
        text, usage, finish = "", None, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert text == full.choices[0].message.content and finish == "length"
        assert usage is not None and usage.completion_tokens == 40
        assert sum(taken) >= 30  # most tokens went the lane's way (the first and the last cannot)
        taken.clear()  # a request with a stop string reads every delta in the relay loop
        stopped = await s.client.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=10, stream=True, stop=["never-seen"]
        )
        assert [c.choices[0].finish_reason async for c in stopped if c.choices][-1] == "length"
        assert taken == []


async def test_killed_worker_mid_stream(tokenizer):
    async with stack(tokenizer, [Phase.DECODE, Phase.DECODE], delay=0.004) as s:
        baseline = await s.client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=30)
        stream = await s.client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=30, stream=True)
        text, n = "", 0
        async for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
            n += 1
            if n == 5:
                busy = [w for w in s.workers.values() if w._running]
                busy[0].kill()
        assert text == baseline.choices[0].message.content

    # The only worker dies (not restarted): the stream ends with an error once the wait for a node is over.
    async with stack(tokenizer, [Phase.DECODE], delay=0.004, resume_wait_s=0.3) as s:
        stream = await s.client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=30, stream=True)
        with pytest.raises(openai.APIError):
            n = 0
            async for _chunk in stream:
                n += 1
                if n == 5:
                    next(iter(s.workers.values())).kill()
        async with httpx.AsyncClient() as h:
            resp = await h.post(
                f"{s.url}/v1/chat/completions", json={"model": "demo", "messages": MESSAGES, "max_tokens": 3}
            )
        assert resp.status_code in (502, 503) and "error" in resp.json()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, None),
        (b'{"model": "demo"}', 400, None),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 5}', 400, None),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model_not_found"),
        (
            b'{"model": "demo", "messages": [{"role": "user", "content": "' + b"x" * 70000 + b'"}]}',
            413,
            "payload_too_large",
        ),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400, None),
    ],
)
async def test_malformed_requests_get_openai_errors_and_gateway_stays_up(tokenizer, body, status, code):
    async with stack(tokenizer, [Phase.DECODE]) as s, httpx.AsyncClient() as h:
        r = await h.post(f"{s.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
        if code:
            assert err["code"] == code
        bad_branch = await h.post(
            f"{s.url}/v1/chat/completions",
            headers={"X-Branch-ID": "a/b"},
            json={"model": "demo", "messages": MESSAGES},
        )
        assert bad_branch.status_code == 400
        assert (await h.get(f"{s.url}/v1/nothing")).json()["error"]["code"] == "not_found"
        ok = await h.post(f"{s.url}/v1/chat/completions", json={"model": "demo", "messages": MESSAGES, "max_tokens": 2})
        assert ok.status_code == 200
        assert (await h.get(f"{s.url}/healthz")).status_code == 200
        assert (await h.get(f"{s.url}/readyz")).status_code == 200
        metrics = (await h.get(f"{s.url}/metrics")).text
        assert "evolving_requests_total" in metrics and "evolving_node_queue_depth" in metrics
