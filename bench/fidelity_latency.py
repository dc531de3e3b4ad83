"""Latencies of the live demo cluster that the simulator adds beside its
iteration model, measured for `simulate --fidelity` (pure functions over
the workers' iteration records and per-request engine timings).

What a request spends outside the iterations the profile models is
measured on the live run, from the workers' own clocks (vLLM's per-request
first-token latency and the worker's time of that token, the engine's
end-to-end time, the blocks offered from peers; the nodes' iteration
records), never tuned to the result:
- `step_overhead_ms`: the mean gap between back-to-back decode iterations
  of one worker minus vLLM's `elapsed_ms` (scheduler, output processing),
  added to both intercepts;
- `engine_in_s`, `engine_out_s`: a request alone in its engine, from
  reaching the engine to its first iteration's start; an iteration's end to
  the worker having its token (`engine_latencies`);
- `pull_latency_s` / `prefill_pull_latency_s`: the same wait, less
  `engine_in_s`, for requests whose cached prefix comes from a peer's host
  store, on the decode and on the prefill node (they differ: 8 and 28 ms
  in one run);
- `request_overhead_s`: client TTFT - engine TTFT for streamed first tokens
  (the gateway, the workers' HTTP sides, the client), added to every
  arrival; `prefill_answer_s`: what a prefill node's first token costs
  from its iteration's end to the client beyond a streamed one (a
  non-streaming answer after the KV save is confirmed);
- `handoff_s`: the prefill worker's first token to the decode engine
  receiving the decode segment; `stream_lag_s`: how much longer a stream's
  last token takes from the engine to the client than its first token.
On this 2-core host these paths share the cores with both engines, so they
are measured under the slice's load; `request_overhead_isolated_s` is the
mean (client - engine) TTFT of the calibration requests sent one at a time
before the slice.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from planner.types import IterationRecord


def step_overhead_ms(records: list[IterationRecord], max_gap_ms: float = 1000.0) -> float:
    """Mean (gap between consecutive decode iterations - elapsed) while the batch
    was unchanged (so the node surely had work): engine time outside vLLM's
    `elapsed_ms`, including CPU contention on a shared host."""
    gaps: list[float] = []
    by_node: dict[str, list[IterationRecord]] = {}
    for r in records:
        by_node.setdefault(r.node_id, []).append(r)
    for rs in by_node.values():
        rs.sort(key=lambda r: r.t)
        for prev, cur in zip(rs, rs[1:], strict=False):
            if cur.uncached_prompt_tokens or prev.uncached_prompt_tokens or cur.batch_size != prev.batch_size:
                continue
            idle = (cur.t - prev.t) * 1000.0 - cur.elapsed_ms
            if 0.0 <= idle <= max_gap_ms and cur.batch_size > 0:
                gaps.append(idle)
    return float(np.mean(gaps)) if gaps else 0.0


@dataclass(frozen=True)
class EngineLatencies:
    """What a request spends in an engine beside its iterations (seconds)."""

    engine_in_s: float  # reaching the engine -> its first iteration starts (alone, no KV from peers)
    engine_out_s: float  # the decode node's first-token iteration ends -> the worker has the token
    pull_latency_s: (
        float  # the decode node: reaching the engine -> first iteration (alone, KV from peers) - engine_in_s
    )
    prefill_pull_latency_s: float  # the same on the prefill node
    prefill_out_s: float  # the same as engine_out_s on the prefill node
    samples: dict[str, int]


def engine_latencies(records: list[IterationRecord], timings: dict[str, dict]) -> EngineLatencies:
    """From the workers' own clocks: each first token's engine timing (vLLM's
    first-token latency, the worker's wall time of the token, its node, the
    blocks it was offered from peers) and the node's iteration records (end
    time, elapsed). A segment is *alone* when one iteration of its node
    ended while it was in the engine: then the time before that iteration
    started is the engine's own latency (input processing, waiting for KV
    from peers), not queueing. Decode segments after a prefill (`<id>.2`)
    always pull the prompt's new blocks from the prefill node."""
    by_node: dict[str, list[IterationRecord]] = {}
    for r in records:
        by_node.setdefault(r.node_id, []).append(r)
    ends = {n: [r.t for r in sorted(rs, key=lambda r: r.t)] for n, rs in by_node.items()}
    starts = {n: {r.t: r.t - r.elapsed_ms / 1000.0 for r in rs} for n, rs in by_node.items()}
    outs: dict[str, list[float]] = {"prefill": [], "decode": []}
    local_in: list[float] = []
    pulled_in: dict[str, list[float]] = {"prefill": [], "decode": []}
    for rid, tm in timings.items():
        ts = ends.get(tm.get("node_id", ""))
        if not ts:
            continue
        arrived, got = tm["t"] - tm["engine_ttft_s"], tm["t"]
        lo, hi = bisect.bisect_left(ts, arrived), bisect.bisect_right(ts, got)
        if hi == 0:
            continue
        outs[tm["role"]].append(got - ts[hi - 1])
        if hi - lo == 1:
            waited = starts[tm["node_id"]][ts[hi - 1]] - arrived
            if rid.endswith(".2") or tm.get("peer_blocks", 0):
                pulled_in[tm["role"]].append(waited)
            else:
                local_in.append(waited)
    mean = lambda xs: max(0.0, float(np.mean(xs))) if xs else 0.0  # noqa: E731
    e_in = mean(local_in)
    pull = {role: max(0.0, mean(xs) - e_in) if xs else 0.0 for role, xs in pulled_in.items()}
    return EngineLatencies(
        e_in,
        mean(outs["decode"]),
        pull["decode"],
        pull["prefill"],
        mean(outs["prefill"]),
        {
            "out": len(outs["decode"]),
            "prefill_out": len(outs["prefill"]),
            "local_in": len(local_in),
            "pulled_in": len(pulled_in["decode"]),
            "prefill_pulled_in": len(pulled_in["prefill"]),
        },
    )


def path_overhead_s(results: list[dict], timings: dict[str, dict], role: str | None = None) -> float | None:
    """Mean of (client TTFT - the first segment's engine TTFT): the gateway,
    HTTP and client part of a request's first token, which the simulator
    does not model; only requests whose first segment had `role`, if given.
    The gateway names a request's segments `<id>.1`, `<id>.2`..."""
    firsts = [(x, timings[f"{x['id']}.1"]) for x in results if f"{x['id']}.1" in timings]
    gaps = [(x["ttft"] - x["t0"]) - t["engine_ttft_s"] for x, t in firsts if role is None or t["role"] == role]
    return float(np.mean(gaps)) if gaps else None


def stream_lag_s(results: list[dict], timings: dict[str, dict]) -> float | None:
    """Mean of how much longer a stream's last token takes from the engine
    to the client than its first token did: (client E2E - engine E2E) -
    (client TTFT - engine TTFT), over requests served by one decode segment
    (the worker's output relay under load, the gateway's SSE relay)."""
    lags = []
    for x in results:
        one, two = timings.get(f"{x['id']}.1"), timings.get(f"{x['id']}.2")
        if one and not two and one["role"] == "decode" and one.get("engine_e2e_s") is not None:
            lags.append(((x["t1"] - x["t0"]) - one["engine_e2e_s"]) - ((x["ttft"] - x["t0"]) - one["engine_ttft_s"]))
    return float(np.mean(lags)) if lags else None


def handoff_s(results: list[dict], timings: dict[str, dict]) -> float | None:
    """Mean time from the prefill worker seeing a request's first token to the
    decode worker's engine receiving its decode segment (both on this host's
    clock): the prefill answer, the gateway and the decode call."""
    hops = []
    for x in results:
        pre, dec = timings.get(f"{x['id']}.1"), timings.get(f"{x['id']}.2")
        if pre and dec and pre["role"] == "prefill" and dec["role"] == "decode":
            hops.append((dec["t"] - dec["engine_ttft_s"]) - pre["t"])
    return float(np.mean(hops)) if hops else None
