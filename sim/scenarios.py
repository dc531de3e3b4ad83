"""Named simulation scenarios: a workload, a cluster size and what to compare.

Each builder is pure and seeded; `simulate` runs the planners on it. Every
option either changes the run or is refused with a `ValueError` that says
why and what to use instead (the command line turns it into exit code 2):

| scenario | --trace | --load | --duration | --nodes | --spread | --mix | --initial-prefill |
|---|---|---|---|---|---|---|---|
| trace | required | sessions x K | cut / horizon | yes | yes | no | yes |
| shift, scale, burst, lowrate | no | agents x K | yes | yes | no | no | yes |
| decode-heavy | no | rate x K | yes | yes | no | no | yes |
| fixed-4p5d | optional | agents (or sessions) x K | yes | no (4P5D) | with --trace | without --trace | no |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sim import replay, traces, workloads

SHIFT_AGENTS_PER_NODE = 48
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SERVEGEN_R1 = TRACES / "servegen" / "reason" / "deepseek-r1"
SERVEGEN_START_S = 36_000.0  # hour 10 of ServeGen's day: a busy slice


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: workloads.Workload
    nodes: int
    prefill_nodes: int  # initial split for adaptive planners
    note: str


def load_trace(
    path: str | Path, *, seed: int, load: float | None, duration_s: float | None, spread_s: float | None
) -> workloads.Workload:
    """A trace file or folder at `load` times its sessions (`sim.replay`),
    spread over `spread_s`, cut at `duration_s`. ServeGen folders are
    sampled from hour 10 for `duration_s` (default 1 h) at `load` x the rate."""
    if traces.trace_format(path) == "servegen":
        if spread_s is not None:
            raise ValueError("--spread applies to recorded traces, not to ServeGen's sampled distributions")
        d = duration_s or 3_600.0
        return traces.load_servegen(path, seed=seed, duration_s=d, start_s=SERVEGEN_START_S, rate_scale=load or 1.0)
    wl = traces.load_any(path, seed=seed)
    if load is not None or spread_s is not None:
        wl = replay.scale(wl, load=load or 1.0, seed=seed, window_s=spread_s)
    return replay.cut(wl, duration_s) if duration_s is not None else wl


def _refuse(name: str, given: dict[str, object], why: str) -> None:
    for flag, value in given.items():
        if value is not None:
            raise ValueError(f"--scenario {name} does not take {flag}: {why}")


def _check_options(
    name: str,
    nodes: int | None,
    initial_prefill: int | None,
    duration_s: float | None,
    scale: float | None,
    mix: str | None,
) -> None:
    """ValueError naming the command-line flag of the first bad option."""
    for flag, value in (("--nodes", nodes), ("--initial-prefill", initial_prefill)):
        if value is not None and value < (2 if flag == "--nodes" else 0):
            raise ValueError(f"{flag} must be >= {2 if flag == '--nodes' else 0}, got {value}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"--duration must be > 0 s, got {duration_s}")
    if scale is not None and not scale > 0:
        raise ValueError(f"--load must be > 0, got {scale}")
    if mix is not None and name != "fixed-4p5d":
        raise ValueError(f"--mix applies to fixed-4p5d only, not {name!r}")


def build(
    name: str,
    *,
    seed: int,
    nodes: int | None = None,
    trace: str | None = None,
    duration_s: float | None = None,
    scale: float | None = None,
    mix: str | None = None,
    spread_s: float | None = None,
    initial_prefill: int | None = None,
) -> Scenario:
    """`scale` multiplies the agent count (so --nodes can grow the cluster
    with the same per-node load), a trace's sessions or an open-loop rate;
    `mix` picks fixed-4p5d's agent kind (module doc: what each takes)."""
    _check_options(name, nodes, initial_prefill, duration_s, scale, mix)
    k = 1.0 if scale is None else scale
    own = "it builds its own workload; replay a trace with --scenario trace --trace F"
    if name == "trace":
        if trace is None:
            raise ValueError("--scenario trace needs --trace FILE_OR_FOLDER")
        n = nodes or 9
        wl = load_trace(trace, seed=seed, load=scale, duration_s=duration_s, spread_s=spread_s)
        sc = Scenario(name, wl, n, n // 3 or 1, f"trace {trace} ({len(wl.requests)} requests)")
    elif name == "fixed-4p5d":
        _refuse(name, {"--nodes": nodes, "--initial-prefill": initial_prefill}, "it compares KV loading on 4P5D")
        if trace is not None:
            _refuse(name, {"--mix": mix}, "--trace gives the workload")
            wl = load_trace(trace, seed=seed, load=scale, duration_s=duration_s, spread_s=spread_s)
            return Scenario(name, wl, 9, 4, f"trace {trace} on a fixed 4P5D, async vs layer-by-layer KV")
        _refuse(name, {"--spread": spread_s}, "--spread spreads a trace's sessions (give --trace)")
        return _fixed_4p5d(seed, duration_s or 1_800.0, k, mix or "coding")
    else:
        _refuse(name, {"--trace": trace, "--spread": spread_s}, own)
        builder = _BUILDERS.get(name)
        if builder is None:
            raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        sc = builder(seed, nodes, duration_s, k)
    if initial_prefill is not None:
        if initial_prefill > sc.nodes:
            raise ValueError(f"--initial-prefill {initial_prefill} exceeds the {sc.nodes} nodes")
        sc = Scenario(sc.name, sc.workload, sc.nodes, initial_prefill, sc.note)
    return sc


def _shift(seed: int, nodes: int | None, duration_s: float | None, k: float) -> Scenario:
    n, d = nodes or 9, duration_s or 10_800.0
    # 48 agent slots per node: enough that the math phase is decode-bound
    # (its best split is 1-2 prefill nodes) while computer use is
    # prefill-bound (7-8 prefill nodes). At 12 per node the math phase
    # barely loads the decode nodes and every split from 1P to 5P serves
    # it equally, so the scenario would not be a shift (docs/benchmarks-history.md).
    wl = workloads.shift(seed=seed, duration_s=d, concurrency=int(SHIFT_AGENTS_PER_NODE * n * k))
    note = f"3 h, math agents -> computer-use agents, closed loop, {SHIFT_AGENTS_PER_NODE} agents/node"
    return Scenario("shift", wl, n, max(1, n // 3), note)


def _scale(seed: int, nodes: int | None, duration_s: float | None, k: float) -> Scenario:
    n, d = nodes or 768, duration_s or 3_600.0
    wl = workloads.shift(seed=seed, duration_s=d, concurrency=int(12 * n * k))
    return Scenario("scale", wl, n, max(1, n // 3), f"{n} nodes x 4 GPUs, 1 h shift workload")


def _burst(seed: int, nodes: int | None, duration_s: float | None, k: float) -> Scenario:
    n = nodes or 9
    wl = workloads.subagent_burst(
        seed=seed, duration_s=duration_s or 2_400.0, background=int(8 * n * k), burst_at_s=1_200.0, fanout=64
    )
    return Scenario("burst", wl, n, max(1, n // 3), "steady coding agents + one 64-way sub-agent burst at 20 min")


def _lowrate(seed: int, nodes: int | None, duration_s: float | None, k: float) -> Scenario:
    n, d = nodes or 9, duration_s or 7_200.0
    wl = workloads.agents(workloads.shift_mix(d), duration_s=d, seed=seed, agents_per_min=0.75 * k, name="lowrate")
    return Scenario("lowrate", wl, n, max(1, n // 3), "open-loop 0.75 agents/min, math -> computer-use")


def _decode_heavy(seed: int, nodes: int | None, duration_s: float | None, k: float) -> Scenario:
    n, d = nodes or 9, duration_s or 3_600.0
    if SERVEGEN_R1.exists():
        wl = traces.load_servegen(SERVEGEN_R1, seed=seed, duration_s=d, start_s=SERVEGEN_START_S, rate_scale=k)
    else:
        wl = workloads.constant("math", duration_s=d, seed=seed, concurrency=int(24 * n * k))
    return Scenario("decode-heavy", wl, n, max(1, n // 3), "ServeGen DeepSeek-R1 clients (decode-heavy), open loop")


def _fixed_4p5d(seed: int, duration_s: float, k: float, kind: str) -> Scenario:
    if kind not in workloads.SHAPES:
        raise ValueError(f"unknown mix {kind!r}: one of {sorted(workloads.SHAPES)}")
    # Coding agents are decode-bound on 4P5D (prefill nodes ~60 % idle
    # whatever the loading); `cu` loads the prefill nodes as the study's
    # run did (~20 % idle), where waiting for KV is what idles them.
    agents = int(126 * k)
    wl = workloads.constant(kind, duration_s=duration_s, seed=seed, concurrency=agents)
    note = f"{agents} concurrent {kind} agents, fixed 4P5D, async vs layer-by-layer KV"
    return Scenario("fixed-4p5d", wl, 9, 4, note)


_BUILDERS: dict[str, Callable[[int, int | None, float | None, float], Scenario]] = {
    "shift": _shift,
    "scale": _scale,
    "burst": _burst,
    "lowrate": _lowrate,
    "decode-heavy": _decode_heavy,
}
SCENARIOS = ("trace", "shift", "burst", "fixed-4p5d", "scale", "lowrate", "decode-heavy")
