"""Event loop and node engines on tiny hand-checked scenarios (exact times)."""

from __future__ import annotations

import pytest

from sim.decode import DecodeEngine
from sim.events import EventLoop
from sim.node import PrefillEngine
from sim.profiles import LinearIterationModel
from sim.state import NodeConfig, SimRequest
from sim.workloads import Request

# prefill ms = 10 + 1 per uncached token; decode ms = 5 + 1 per sequence (no context term)
MODEL = LinearIterationModel((10.0, 1.0, 0.0, 0.0), (5.0, 1.0, 0.0))


def req(i: int, prompt: int, out: int) -> SimRequest:
    return SimRequest(Request(i, "s", "b", 0.0, prompt, out), 0.0)


def test_loop_runs_in_time_then_seq_order() -> None:
    loop, seen = EventLoop(), list[str]()
    loop.at(2.0, seen.append, "c")
    loop.at(1.0, seen.append, "a")
    loop.at(1.0, seen.append, "b")
    loop.run(1.5)
    assert seen == ["a", "b"] and loop.now == 1.5
    loop.run(10.0)
    assert seen == ["a", "b", "c"]


def _decode(loop: EventLoop, cfg: NodeConfig = NodeConfig()) -> tuple[DecodeEngine, dict[int, float]]:
    done: dict[int, float] = {}
    eng = DecodeEngine("d", loop, MODEL, cfg, lambda sr, t: None, lambda sr, t: done.__setitem__(sr.req.req_id, t), [])
    return eng, done


def test_decode_single_request_exact() -> None:
    loop = EventLoop()
    eng, done = _decode(loop)
    r = req(0, 100, 4)
    r.generated = 1  # prefilled elsewhere: 3 decode iterations of 6 ms
    eng.submit(r)
    loop.run(10.0)
    assert done[0] == pytest.approx(0.018)


def test_decode_arrival_joins_at_next_iteration_boundary() -> None:
    loop = EventLoop()
    eng, done = _decode(loop)
    a, b = req(0, 10, 11), req(1, 10, 3)
    a.generated = b.generated = 1
    loop.at(0.0, eng.submit, a)  # 10 iterations alone: 6 ms each
    loop.at(0.014, eng.submit, b)  # mid third iteration (12..18 ms): joins at 18 ms
    loop.run(10.0)
    # b: 2 iterations of 7 ms from 18 ms -> 32 ms. a: 3 alone (18) + 2 shared (14) + 5 alone (30) = 62 ms
    assert done[1] == pytest.approx(0.032)
    assert done[0] == pytest.approx(0.062)


def test_decode_context_term_sums_in_closed_form() -> None:
    loop = EventLoop()
    model = LinearIterationModel((0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 1.0))  # 1 ms per context token
    done: dict[int, float] = {}
    eng = DecodeEngine("d", loop, model, NodeConfig(), lambda s, t: None, lambda s, t: done.__setitem__(0, t), [])
    r = req(0, 10, 4)
    r.generated = 1  # contexts 11, 12, 13 -> 36 ms
    eng.submit(r)
    loop.run(1.0)
    assert done[0] == pytest.approx(0.036)


def test_decode_kv_capacity_queues_second_request() -> None:
    loop = EventLoop()
    eng, done = _decode(loop, NodeConfig(kv_capacity_tokens=120))
    a, b = req(0, 100, 3), req(1, 40, 3)
    a.generated = b.generated = 1
    eng.submit(a)
    eng.submit(b)  # 103 + 43 > 120: waits for a
    loop.run(1.0)
    assert done[0] == pytest.approx(0.012) and done[1] == pytest.approx(0.024)


def test_prefill_chunking_and_async_ready_time() -> None:
    loop = EventLoop()
    fin: dict[int, float] = {}
    eng = PrefillEngine(
        "p", loop, MODEL, NodeConfig(chunk_tokens=100), lambda sr, t: fin.__setitem__(sr.req.req_id, t), []
    )
    a, b = req(0, 150, 1), req(1, 50, 1)
    b.ready_at = 0.5  # its prefix KV is still being pulled
    eng.submit(a)
    eng.submit(b)
    loop.run(5.0)
    # a: chunk 100 (110 ms) + chunk 50 (60 ms) = 170 ms; b waits for its KV: 0.5 + 60 ms
    assert fin[0] == pytest.approx(0.170) and fin[1] == pytest.approx(0.560)
    assert eng.compute_s == pytest.approx(0.230)


def test_prefill_attention_term_is_per_request_in_a_batched_chunk() -> None:
    """While a first prompt computes (10 + 100 + 1 = 111 ms), two more queue
    and share the next chunk: 100 tokens, and 100 over 300 cached:
    10 + 200 + 0.5*300 + 1*(100*100 + 100*400)/1e4 = 365 ms (from totals,
    200*500/1e4, it would be 370 ms)."""
    model = LinearIterationModel((10.0, 1.0, 0.5, 1.0), (5.0, 1.0, 0.0))
    loop = EventLoop()
    fin: dict[int, float] = {}
    eng = PrefillEngine("p", loop, model, NodeConfig(), lambda sr, t: fin.__setitem__(sr.req.req_id, t), [])
    first, a, b = req(0, 100, 1), req(1, 100, 1), req(2, 400, 1)
    b.cached = 300
    for r in (first, a, b):
        eng.submit(r)
    loop.run(5.0)
    assert fin[0] == pytest.approx(0.111)
    assert fin[1] == fin[2] == pytest.approx(0.111 + 0.365)


def test_prefill_layerwise_adds_transfer_to_iteration() -> None:
    loop = EventLoop()
    fin: dict[int, float] = {}
    eng = PrefillEngine("p", loop, MODEL, NodeConfig(layerwise_kv=True), lambda sr, t: fin.__setitem__(0, t), [])
    a = req(0, 50, 1)
    a.stall_s = 0.04
    eng.submit(a)
    loop.run(1.0)
    assert fin[0] == pytest.approx(0.100) and eng.stall_s == pytest.approx(0.04)


def _one_request_run(prompt: int, out: int, node: NodeConfig) -> tuple[float, float]:
    from sim.cluster import Cluster, SimConfig
    from sim.profiles import GpuProfile
    from sim.workloads import Workload

    gpu = GpuProfile("test", 1, MODEL, node, relaunch_s=0.0, source={})
    wl = Workload("one", (Request(0, "s", "b", 0.0, prompt, out),), 10.0, closed_loop=False)
    log = Cluster(wl, gpu, None, SimConfig(nodes=2, prefill_nodes=1)).run()
    ((arrival, first, finish, *_),) = log.rows
    return first, finish


@pytest.mark.parametrize(
    ("handoff", "answer", "e_in", "e_out", "pull"),
    [
        (0.0, 0.0, 0.0, 0.0, 0.0),
        (0.05, 0.0, 0.0, 0.0, 0.0),
        (0.05, 0.02, 0.0, 0.0, 0.0),
        (0.05, 0.02, 0.003, 0.004, 0.015),
    ],
)
def test_cluster_disaggregated_request_exact_with_latencies(
    handoff: float, answer: float, e_in: float, e_out: float, pull: float
) -> None:
    """1P1D, one request of 300 uncached tokens (above the 256 local-prefill
    threshold): `e_in`, prefill 310 ms on the prefill node, `e_out` (its
    answer reaches the client `answer` later: the first token), then the
    handoff, `e_in` and the decode node's pull of the prompt's KV, then 2
    decode iterations of 6 ms and `e_out`."""
    node = NodeConfig(
        kv_bytes_per_token=1,
        pool_gbps=1e6,
        handoff_s=handoff,
        prefill_answer_s=answer,
        engine_in_s=e_in,
        engine_out_s=e_out,
        pull_latency_s=pull,
    )  # KV bytes move in ~0 time
    first, finish = _one_request_run(300, 3, node)
    assert first == pytest.approx(e_in + 0.310 + e_out + answer)
    assert finish == pytest.approx(e_in + 0.310 + e_out + handoff + e_in + pull + 0.012 + e_out, abs=1e-6)


@pytest.mark.parametrize(("e_in", "e_out", "lag"), [(0.0, 0.0, 0.0), (0.003, 0.004, 0.0), (0.003, 0.004, 0.02)])
def test_cluster_local_prefill_exact_with_engine_latencies(e_in: float, e_out: float, lag: float) -> None:
    """200 uncached tokens: the decode node computes the prompt in its first
    iteration (210 ms of prefill + a 6 ms decode step), then 2 more steps;
    the last token reaches the client `lag` later than a first token would."""
    first, finish = _one_request_run(200, 3, NodeConfig(engine_in_s=e_in, engine_out_s=e_out, stream_lag_s=lag))
    assert first == pytest.approx(e_in + 0.216 + e_out)
    assert finish == pytest.approx(e_in + 0.228 + e_out + lag)


def test_cluster_one_token_request_finishes_with_its_prefill_answer() -> None:
    node = NodeConfig(prefill_answer_s=0.02, engine_out_s=0.004, stream_lag_s=0.05)
    first, finish = _one_request_run(300, 1, node)
    assert first == finish == pytest.approx(0.310 + 0.004 + 0.02)
