"""Named simulation scenarios: a workload, a cluster size and what to compare.

Each builder is pure and seeded; `simulate` runs the planners on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sim import traces, workloads

SHIFT_AGENTS_PER_NODE = 48
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: workloads.Workload
    nodes: int
    prefill_nodes: int  # initial split for adaptive planners
    note: str


def _trace_or(path: str | None, fallback: Callable[[], workloads.Workload], seed: int) -> workloads.Workload:
    return traces.load_any(path, seed=seed) if path else fallback()


def build(
    name: str,
    *,
    seed: int,
    nodes: int | None = None,
    trace: str | None = None,
    duration_s: float | None = None,
    scale: float = 1.0,
    mix: str | None = None,
) -> Scenario:
    """`scale` multiplies the agent count (so --nodes can grow the cluster
    with the same per-node load); `mix` picks fixed-4p5d's agent kind."""
    if mix is not None and name != "fixed-4p5d":
        raise ValueError(f"--mix applies to fixed-4p5d only, not {name!r}")
    if name == "shift":
        n = nodes or 9
        d = duration_s or 10_800.0
        # 48 agent slots per node: enough that the math phase is decode-bound
        # (its best split is 1-2 prefill nodes) while computer use is
        # prefill-bound (7-8 prefill nodes). At 12 per node the math phase
        # barely loads the decode nodes and every split from 1P to 5P serves
        # it equally, so the scenario would not be a shift (docs/benchmarks-sim.md).
        agents = int(SHIFT_AGENTS_PER_NODE * n * scale)
        wl = _trace_or(trace, lambda: workloads.shift(seed=seed, duration_s=d, concurrency=agents), seed)
        return Scenario(
            name,
            wl,
            n,
            max(1, n // 3),
            f"3 h, math agents -> computer-use agents, closed loop, {SHIFT_AGENTS_PER_NODE} agents/node",
        )
    if name == "scale":
        n = nodes or 768
        d = duration_s or 3_600.0
        wl = workloads.shift(seed=seed, duration_s=d, concurrency=int(12 * n * scale))
        return Scenario(name, wl, n, max(1, n // 3), f"{n} nodes x 4 GPUs, 1 h shift workload")
    if name == "burst":
        n = nodes or 9
        wl = workloads.subagent_burst(
            seed=seed, duration_s=duration_s or 2_400.0, background=int(8 * n * scale), burst_at_s=1_200.0, fanout=64
        )
        return Scenario(name, wl, n, max(1, n // 3), "steady coding agents + one 64-way sub-agent burst at 20 min")
    if name == "fixed-4p5d":
        d = duration_s or 1_800.0
        kind = mix or "coding"
        if kind not in workloads.SHAPES:
            raise ValueError(f"unknown mix {kind!r}: one of {sorted(workloads.SHAPES)}")
        # Coding agents are decode-bound on 4P5D (prefill nodes ~60 % idle
        # whatever the loading); `cu` loads the prefill nodes as the study's
        # run did (~20 % idle), where waiting for KV is what idles them.
        agents = int(126 * scale)
        wl = _trace_or(trace, lambda: workloads.constant(kind, duration_s=d, seed=seed, concurrency=agents), seed)
        return Scenario(name, wl, 9, 4, f"{agents} concurrent {kind} agents, fixed 4P5D, async vs layer-by-layer KV")
    if name == "lowrate":
        n = nodes or 9
        d = duration_s or 7_200.0
        wl = workloads.agents(
            workloads.shift_mix(d), duration_s=d, seed=seed, agents_per_min=0.75 * scale, name="lowrate"
        )
        return Scenario(name, wl, n, max(1, n // 3), "open-loop 0.75 agents/min, math -> computer-use")
    if name == "decode-heavy":
        n = nodes or 9
        d = duration_s or 3_600.0
        folder = TRACES / "servegen" / "reason" / "deepseek-r1"

        def fallback() -> workloads.Workload:
            if folder.exists():
                return traces.load_servegen(folder, seed=seed, duration_s=d, start_s=36_000.0, rate_scale=scale)
            return workloads.constant("math", duration_s=d, seed=seed, concurrency=int(24 * n * scale))

        return Scenario(
            name,
            _trace_or(trace, fallback, seed),
            n,
            max(1, n // 3),
            "ServeGen DeepSeek-R1 clients (decode-heavy), open loop",
        )
    raise ValueError(f"unknown scenario {name!r}")


SCENARIOS = ("shift", "burst", "fixed-4p5d", "scale", "lowrate", "decode-heavy")
