"""A running gateway's /metrics text for the dashboard checks (test_dashboard.py).

A real gateway app on a free port in front of two fake workers (the worker
protocol, no vLLM), after a streamed request, a refused one and a phase
switch, so the labelled series have samples; the text is what a Prometheus
scrape of it reads.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from core import Phase
from gateway.app import create_app
from gateway.serving.tokenize import PromptTokenizer
from gateway.settings import GatewaySettings
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.stacks import serve


async def _scrape(tokenizer: PromptTokenizer) -> str:
    async with contextlib.AsyncExitStack() as es:
        urls = []
        for i, phase in enumerate((Phase.PREFILL, Phase.DECODE)):
            worker = FakeWorker(f"w{i}", phase=phase, token_range=(10, tokenizer.vocab_size))
            urls.append(await es.enter_async_context(serve(create_fake_worker_app(worker))))
        settings = GatewaySettings(model_name="demo", worker_urls=tuple(urls), heartbeat_interval_s=0.05)
        app = create_app(settings, tokenizer=tokenizer)
        url = await es.enter_async_context(serve(app))
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": "demo", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
            assert (await client.post("/v1/chat/completions", json={**body, "stream": True})).status_code == 200
            assert (await client.post("/v1/chat/completions", json={**body, "model": "nope"})).status_code == 404
            outcome = await app.state.runtime.cluster.switch("w0", "decode", reason="test", who="pytest")
            assert outcome.outcome == "ok"
            scrape = await client.get("/metrics")
            assert scrape.status_code == 200
            return scrape.text


@pytest.fixture(scope="session")
def gateway_metrics_text(tokenizer: PromptTokenizer) -> str:
    return asyncio.run(_scrape(tokenizer))
