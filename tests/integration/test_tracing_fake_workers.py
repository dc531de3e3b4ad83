"""Gateway traces over real HTTP, in front of fake workers, exported over
OTLP/HTTP to the test receiver (`testing.otlp_receiver`, protobuf decoded
with the OpenTelemetry proto package). The real-vLLM version, with the
workers' own spans, is tests/integration/test_tracing_vllm.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI

from core import Phase
from core.tracing import TraceSettings
from gateway.app import create_app
from gateway.serving.tokenize import PromptTokenizer
from gateway.settings import GatewaySettings
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.otlp_receiver import OTLPReceiver, ReceivedSpan
from testing.stacks import serve

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Agents call tools, read their results and continue the conversation."},
]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as rx:
        yield rx


@contextlib.asynccontextmanager
async def traced_stack(
    tokenizer: PromptTokenizer, rx: OTLPReceiver, phases: list[Phase], *, delay: float = 0.0, ratio: float = 1.0
) -> AsyncIterator[tuple[str, FastAPI]]:
    async with contextlib.AsyncExitStack() as es:
        urls = []
        for i, phase in enumerate(phases):
            w = FakeWorker(f"w{i}", phase=phase, token_delay_s=delay, token_range=(10, tokenizer.vocab_size))
            urls.append(await es.enter_async_context(serve(create_fake_worker_app(w))))
        cfg = GatewaySettings(
            model_name="demo",
            worker_urls=tuple(urls),
            heartbeat_interval_s=0.05,
            local_prefill_max_tokens=8,
            tracing=TraceSettings(endpoint=rx.url + "/v1/traces", sample_ratio=ratio),
        )
        app = create_app(cfg, tokenizer=tokenizer)
        url = await es.enter_async_context(serve(app, gateway_server=True))  # as production serves it
        yield url, app


def _by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    out: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def _chat(url: str, *, stream: bool, headers: dict[str, str] | None = None, max_tokens: int = 12) -> httpx.Response:
    body = {"model": "demo", "messages": MESSAGES, "max_tokens": max_tokens, "stream": stream, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=30)


async def test_one_trace_per_request_with_genai_attributes_and_client_parent(tokenizer, receiver):
    # Tokens a read apart: most go out through the relay lane, and the relay span counts them.
    async with traced_stack(tokenizer, receiver, [Phase.PREFILL, Phase.DECODE], delay=0.004) as (url, app):
        headers = {
            "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
            "X-Branch-ID": "b-trace",
            "X-Session-ID": "s-trace",
        }
        r = await asyncio.to_thread(_chat, url, stream=True, headers=headers)
        assert r.status_code == 200 and "data: [DONE]" in r.text
        app.state.tracing.flush()
        spans = receiver.wait_for(lambda ss: any(s.kind == "server" and s.trace_id == CLIENT_TRACE for s in ss))
    trace = [s for s in spans if s.trace_id == CLIENT_TRACE]
    names = _by_name(trace)
    (root,) = names["chat demo"]
    assert root.kind == "server" and root.parent_span_id == CLIENT_SPAN  # the client's span is the parent
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "demo"
    assert a["gen_ai.usage.output_tokens"] == 12 and a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["evolving.branch"] == "b-trace" and a["evolving.session"] == "s-trace"
    assert a["evolving.tenant"] and a["evolving.first_phase"] == "prefill"
    assert set(a["evolving.nodes"]) == {"w0", "w1"} and a["http.response.status_code"] == 200
    for name in ("tokenize", "admission", "prefill", "decode", "relay"):
        assert len(names[name]) == 1, (name, sorted(names))
        assert names[name][0].parent_span_id == root.span_id, name
    assert len(names["route"]) == 2 and all(s.parent_span_id == root.span_id for s in names["route"])
    assert names["relay"][0].attributes["evolving.relay.bytes"] == len(r.content)  # the lane's bytes too
    prefill, decode = names["prefill"][0], names["decode"][0]
    assert prefill.kind == decode.kind == "client"
    assert prefill.attributes["evolving.node"] == "w0" and decode.attributes["evolving.node"] == "w1"
    assert prefill.end_ns <= decode.start_ns  # the decode runs after the prefill returned its token
    assert names["route"][0].attributes["evolving.route.node"] == "w0"
    assert set(names["route"][0].attributes["evolving.route.candidates"]) == {"w0", "w1"}
    assert names["tokenize"][0].end_ns <= names["admission"][0].start_ns
    assert all(root.start_ns <= s.start_ns and s.end_ns <= root.end_ns for s in trace if s is not root)


async def test_a_malformed_traceparent_starts_a_new_trace(tokenizer, receiver):
    async with traced_stack(tokenizer, receiver, [Phase.DECODE]) as (url, app):
        r = await asyncio.to_thread(_chat, url, stream=False, headers={"traceparent": "00-zz-bad-01"})
        assert r.status_code == 200
        app.state.tracing.flush()
        spans = receiver.wait_for(lambda ss: any(s.kind == "server" for s in ss))
    (root,) = [s for s in spans if s.kind == "server"]
    assert root.parent_span_id == "" and len(root.trace_id) == 32
    assert "relay" not in {s.name for s in spans}  # a non-streamed answer is one write


async def test_ratio_zero_sends_nothing_and_the_request_is_served(tokenizer, receiver):
    async with traced_stack(tokenizer, receiver, [Phase.DECODE], ratio=0.0) as (url, app):
        r = await asyncio.to_thread(_chat, url, stream=True)
        assert r.status_code == 200 and "data: [DONE]" in r.text
        app.state.tracing.flush()
    assert receiver.spans() == []


async def test_a_phase_switch_is_a_span_linked_to_the_decodes_it_migrated(tokenizer, receiver):
    async with traced_stack(tokenizer, receiver, [Phase.DECODE, Phase.DECODE], delay=0.01) as (url, app):
        tasks = [asyncio.create_task(asyncio.to_thread(_chat, url, stream=True, max_tokens=60)) for _ in range(4)]
        runtime = app.state.runtime
        for _ in range(200):  # until the decodes run
            if any(n.running for n in runtime.registry.nodes()):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        busy = max(runtime.registry.nodes(), key=lambda n: n.running).node_id
        outcome = await runtime.cluster.switch(busy, Phase.PREFILL, reason="test", who="pytest")
        answers = await asyncio.gather(*tasks)
        assert outcome.outcome == "ok" and all(r.status_code == 200 for r in answers)
        app.state.tracing.flush()
        spans = receiver.wait_for(lambda ss: any(s.name == "phase.switch" for s in ss))
    (switch,) = [s for s in spans if s.name == "phase.switch"]
    assert switch.attributes["evolving.node"] == busy and switch.attributes["evolving.switch.outcome"] == "ok"
    migrated = [link for link in switch.links if link.attributes.get("evolving.link") == "migrated"]
    assert migrated and len(migrated) == switch.attributes["evolving.switch.migrated"]
    decodes = {s.span_id: s for s in spans if s.name == "decode"}
    for link in migrated:  # each link names a decode segment of a request's trace, on the switched node
        seg = decodes[link.span_id]
        assert seg.trace_id == link.trace_id and seg.attributes["evolving.node"] == busy
        assert seg.attributes["evolving.finish_reason"] == "migrated"
        (mig,) = [s for s in spans if s.name == "migrate" and s.trace_id == seg.trace_id]
        assert mig.attributes["evolving.migration.from_node"] == busy
        assert mig.attributes["evolving.migration.to_node"] != busy
        resumed = [s for s in spans if s.name == "decode" and s.trace_id == seg.trace_id and s is not seg]
        assert resumed and resumed[0].attributes["evolving.resumed"] is True
