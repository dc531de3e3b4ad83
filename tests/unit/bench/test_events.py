"""Event loop and node engines on tiny hand-checked scenarios (exact times)."""

from __future__ import annotations

import pytest

from bench.sim.decode import DecodeEngine
from bench.sim.events import EventLoop
from bench.sim.node import PrefillEngine
from bench.sim.profiles import LinearIterationModel
from bench.sim.state import NodeConfig, SimRequest
from bench.workloads import Request

# prefill ms = 10 + 1 per uncached token; decode ms = 5 + 1 per sequence (no context term)
MODEL = LinearIterationModel((10.0, 1.0, 0.0, 0.0), (5.0, 1.0, 0.0))


def req(i: int, prompt: int, out: int) -> SimRequest:
    return SimRequest(Request(i, "s", "b", 0.0, prompt, out), 0.0)


def test_loop_runs_in_time_then_seq_order() -> None:
    loop, seen = EventLoop(), []
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
    eng = PrefillEngine("p", loop, MODEL, NodeConfig(chunk_tokens=100), lambda sr, t: fin.__setitem__(sr.req.req_id, t), [])
    a, b = req(0, 150, 1), req(1, 50, 1)
    b.ready_at = 0.5  # its prefix KV is still being pulled
    eng.submit(a)
    eng.submit(b)
    loop.run(5.0)
    # a: chunk 100 (110 ms) + chunk 50 (60 ms) = 170 ms; b waits for its KV: 0.5 + 60 ms
    assert fin[0] == pytest.approx(0.170) and fin[1] == pytest.approx(0.560)
    assert eng.compute_s == pytest.approx(0.230)


def test_prefill_layerwise_adds_transfer_to_iteration() -> None:
    loop = EventLoop()
    fin: dict[int, float] = {}
    eng = PrefillEngine("p", loop, MODEL, NodeConfig(layerwise_kv=True), lambda sr, t: fin.__setitem__(0, t), [])
    a = req(0, 50, 1)
    a.stall_s = 0.04
    eng.submit(a)
    loop.run(1.0)
    assert fin[0] == pytest.approx(0.100) and eng.stall_s == pytest.approx(0.04)


@pytest.mark.parametrize("handoff,answer", [(0.0, 0.0), (0.05, 0.0), (0.05, 0.02)])
def test_cluster_disaggregated_request_exact_with_handoff(handoff: float, answer: float) -> None:
    """1P1D, one request of 300 uncached tokens (above the 256 local-prefill
    threshold): prefill 310 ms on the prefill node (its answer reaches the
    client `answer` later: the first token), then the handoff, then 2 decode
    iterations of 6 ms on the decode node."""
    from bench.sim.cluster import Cluster, SimConfig
    from bench.sim.profiles import GpuProfile
    from bench.workloads import Workload

    node = NodeConfig(kv_bytes_per_token=1, pool_gbps=1e6, handoff_s=handoff, prefill_answer_s=answer)  # KV moves in ~0 time
    gpu = GpuProfile("test", 1, MODEL, node, relaunch_s=0.0, source={})
    wl = Workload("one", (Request(0, "s", "b", 0.0, 300, 3),), 10.0, closed_loop=False)
    log = Cluster(wl, gpu, None, SimConfig(nodes=2, prefill_nodes=1)).run()
    (arrival, first, finish, *_), = log.rows
    assert first == pytest.approx(0.310 + answer)
    assert finish == pytest.approx(0.310 + handoff + 0.012, abs=1e-6)
