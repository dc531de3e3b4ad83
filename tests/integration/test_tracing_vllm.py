"""Traces across the real cluster (issue 34): a disaggregated request on the
session's vLLM-CPU workers is one trace, gateway -> prefill -> decode, the
workers' spans (and their KV pulls) under the gateway's; a live migration
shows as its own span; the client's `traceparent` is the trace's parent.

The workers export to the session's OTLP receiver (testing.vllm_cluster);
the gateway here exports to the same one.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time

import httpx
import pytest

from core.tracing import TraceSettings
from testing.fake_leadership import FixedTermLeader
from testing.live_gateway import running_gateway
from testing.otlp_receiver import OTLPReceiver, ReceivedSpan

pytestmark = pytest.mark.vllm
MODEL = "demo-model"
SYSTEM = "You are a careful coding agent. " + " ".join(f"rule {i}: keep edits small." for i in range(40))


@pytest.fixture(scope="module")
def traced_gateway(vllm_cluster, demo_model, otlp_receiver: OTLPReceiver):
    vllm_cluster.phases(wA="prefill", wB="decode")
    tracing = TraceSettings(endpoint=otlp_receiver.url + "/v1/traces", sample_ratio=1.0)
    urls = [vllm_cluster.url("wA"), vllm_cluster.url("wB")]
    # the shared workers refuse orders below the newest term an earlier module's gateway used
    leader = FixedTermLeader(max(vllm_cluster.term("wA"), vllm_cluster.term("wB")) + 1)
    with running_gateway(demo_model, urls, leadership=leader, local_prefill_max_tokens=16, tracing=tracing) as (
        url,
        app,
    ):
        yield url, app
    vllm_cluster.phases(wA="prefill", wB="decode")


def _ids() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def _chat(url: str, traceparent: str, *, max_tokens: int, user: str) -> httpx.Response:
    body = {
        "model": MODEL,
        # The trace id first: no block of this prompt is in a worker's cache from another module's requests
        # (test_gateway_vllm's system prompt starts as this one does), so the decode node must pull them.
        "messages": [
            {"role": "system", "content": f"Task {traceparent[3:11]}. {SYSTEM}"},
            {"role": "user", "content": user},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": "Bearer sk-local", "traceparent": traceparent}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=300)


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, sorted((s.service, s.name) for s in spans))
    return found[0]


def test_disaggregated_request_is_one_trace_gateway_prefill_decode(traced_gateway, otlp_receiver):
    url, app = traced_gateway
    trace_id, client_span = _ids()
    r = _chat(url, f"00-{trace_id}-{client_span}-01", max_tokens=12, user="list the files " + trace_id[:8])
    assert r.status_code == 200 and "data: [DONE]" in r.text
    app.state.tracing.flush()
    # kv_pull too: the engine core's news of a pull can reach the worker, and leave it, after the call's own span
    wanted = {"chat demo-model", "prefill", "decode", "prefill (worker)", "decode (worker)", "relay", "kv_pull"}
    spans = otlp_receiver.wait_for(lambda ss: wanted <= {s.name for s in ss if s.trace_id == trace_id}, 20)
    trace = [s for s in spans if s.trace_id == trace_id]
    root = _one(trace, "chat demo-model")
    assert root.parent_span_id == client_span and root.service == "evolving-infra-gateway"
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.usage.input_tokens"] > 16 and a["gen_ai.usage.output_tokens"] == 12
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["evolving.first_phase"] == "prefill" and list(a["evolving.nodes"]) == ["wA", "wB"]
    # gateway -> prefill segment -> the prefill worker's span; then the decode likewise
    prefill, decode = _one(trace, "prefill"), _one(trace, "decode")
    assert prefill.parent_span_id == root.span_id and decode.parent_span_id == root.span_id
    assert prefill.end_ns <= decode.start_ns
    worker_prefill, worker_decode = _one(trace, "prefill (worker)"), _one(trace, "decode (worker)")
    assert worker_prefill.parent_span_id == prefill.span_id and worker_prefill.service == "evolving-infra-worker"
    assert worker_decode.parent_span_id == decode.span_id
    assert worker_prefill.attributes["evolving.node"] == "wA" and worker_decode.attributes["evolving.node"] == "wB"
    assert worker_decode.attributes["gen_ai.usage.output_tokens"] >= 11
    # the decode node loaded the prompt's blocks that the prefill node saved
    assert decode.attributes["evolving.kv.peer_blocks"] > 0 and decode.attributes["evolving.kv.peers"] == ("wA",)
    pulls = [s for s in trace if s.name == "kv_pull"]
    assert pulls, "the decode worker reported no KV pull"
    assert all(p.parent_span_id == worker_decode.span_id for p in pulls)
    assert pulls[0].attributes["evolving.kv.peer"] == "wA" and pulls[0].attributes["evolving.kv.blocks"] > 0
    assert pulls[0].attributes["evolving.kv.bytes"] > 0
    relay = _one(trace, "relay")
    assert relay.parent_span_id == root.span_id and relay.attributes["evolving.relay.bytes"] > 0


OUTPUT_TOKENS = 3000


def test_migrated_decode_shows_its_migration_span(traced_gateway, vllm_cluster, otlp_receiver):
    url, app = traced_gateway
    runtime, loop = app.state.runtime, app.state.loop

    def switch(node: str, phase: str):
        fut = asyncio.run_coroutine_threadsafe(runtime.cluster.switch(node, phase, reason="test", who="test"), loop)
        return fut.result(120)

    # two decode nodes: a migrated decode has somewhere to go (whatever phases earlier tests left)
    switch("wA", "decode")
    switch("wB", "decode")
    try:
        trace_id, client_span = _ids()
        result: dict[str, httpx.Response] = {}
        # long enough that the decode is still running when the switch lands (the tiny model is fast)
        t = threading.Thread(
            target=lambda: result.update(
                r=_chat(url, f"00-{trace_id}-{client_span}-01", max_tokens=OUTPUT_TOKENS, user="go")
            ),
        )
        t.start()
        node = None
        deadline = time.monotonic() + 60
        while node is None and time.monotonic() < deadline:
            nodes = app.state.tracing.inflight.nodes()
            node = next(iter(nodes.values()), None)
            time.sleep(0.05)
        assert node is not None, "the request never reached a worker"
        time.sleep(0.5)  # some tokens decoded on it
        outcome = switch(node, "prefill")
        t.join(300)
        assert outcome.outcome == "ok" and result["r"].status_code == 200 and "data: [DONE]" in result["r"].text
    finally:
        switch("wB", "decode")
        switch("wA", "prefill")
    app.state.tracing.flush()
    spans = otlp_receiver.wait_for(
        lambda ss: (
            any(s.name == "migrate" and s.trace_id == trace_id for s in ss)
            and sum(s.name == "decode (worker)" and s.trace_id == trace_id for s in ss) >= 2
        ),
        20,
    )
    trace = [s for s in spans if s.trace_id == trace_id]
    root = _one(trace, "chat demo-model")
    assert root.parent_span_id == client_span and root.attributes["evolving.resumes"] >= 1
    assert root.attributes["gen_ai.usage.output_tokens"] == OUTPUT_TOKENS
    migrate = _one(trace, "migrate")
    assert migrate.parent_span_id == root.span_id
    assert migrate.attributes["evolving.migration.from_node"] == node
    assert migrate.attributes["evolving.migration.to_node"] != node
    decodes = sorted((s for s in trace if s.name == "decode"), key=lambda s: s.start_ns)
    assert decodes[0].attributes["evolving.finish_reason"] == "migrated"
    assert decodes[0].end_ns <= migrate.start_ns and migrate.end_ns <= decodes[1].start_ns + 1
    assert decodes[1].attributes["evolving.resumed"] is True
    assert migrate.links and migrate.links[0].span_id == decodes[0].span_id
    # the switch is a span of its own, linked to the decode it migrated
    switches = [s for s in spans if s.name == "phase.switch" and s.attributes.get("evolving.node") == node]
    assert any(link.span_id == decodes[0].span_id for s in switches for link in s.links)
