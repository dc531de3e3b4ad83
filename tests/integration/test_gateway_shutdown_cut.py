"""A stream the gateway's shutdown cuts ends with a typed error, counted.

uvicorn cancels what still runs when its graceful shutdown window closes.
The client's connection is to this replica, so the stream cannot continue
elsewhere: it must end with an OpenAI-shaped `gateway_shutting_down` error
event (the SDK raises it), and `evolving_streams_cut_total` counts it,
never a silent cut. Both stream paths: the plain one (text only) and the
choices one (logprobs asked).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import uvicorn

from core import Phase
from gateway.app import create_app
from gateway.serving.tokenize import PromptTokenizer
from gateway.settings import GatewaySettings
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.stacks import free_port, serve


@contextlib.asynccontextmanager
async def slow_stack(tokenizer: PromptTokenizer) -> AsyncIterator[tuple[str, Any, uvicorn.Server]]:
    async with contextlib.AsyncExitStack() as es:
        urls = []
        for i, phase in enumerate((Phase.PREFILL, Phase.DECODE)):
            w = FakeWorker(f"w{i}", phase=phase, token_delay_s=0.05, token_range=(10, tokenizer.vocab_size))
            urls.append(await es.enter_async_context(serve(create_fake_worker_app(w))))
        settings = GatewaySettings(
            model_name="demo", worker_urls=tuple(urls), heartbeat_interval_s=0.05, local_prefill_max_tokens=8
        )
        app = create_app(settings, tokenizer=tokenizer)
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
        )
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}", app, server
        finally:
            server.should_exit = True
            await task


def cut_count(app: Any) -> float:
    total = 0.0
    for metric in app.state.runtime.metrics.registry.collect():
        if metric.name == "evolving_streams_cut":
            total += sum(s.value for s in metric.samples if s.name == "evolving_streams_cut_total")
    return total


@pytest.mark.parametrize("logprobs", [False, True], ids=["plain", "choices"])
async def test_a_stream_cut_by_the_shutdown_ends_typed_and_counted(tokenizer: PromptTokenizer, logprobs: bool) -> None:
    async with slow_stack(tokenizer) as (url, app, server):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        stream = await client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "Agents call tools and read their results."}],
            max_tokens=400,  # 20 s at 50 ms a token: far past the 1 s grace
            temperature=0,
            stream=True,
            logprobs=logprobs or None,
        )
        chunks = 0
        with pytest.raises(openai.APIError) as cut:
            async for _ in stream:
                chunks += 1
                if chunks == 3:
                    server.should_exit = True  # the gateway stops with this stream running
        assert chunks >= 3
        assert cut.value.code == "gateway_shutting_down", cut.value
        assert "send the request again" in cut.value.message
        assert cut_count(app) == 1
