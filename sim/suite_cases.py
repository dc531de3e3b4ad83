"""The cases of `simulate --suite` (`sim.suite` runs them).

Trace units are found under the traces folder (`discover`): a folder of
agent-text files or of ServeGen chunks is one unit, any other *.jsonl or
*.csv file is one. Units whose workload is the same (agents/aider and
agents/mooncake_style/aider.jsonl: the converted file of the same runs)
are simulated once and reported under every name.

Loads are set per unit from what the 9-node cluster can serve of it:
`LOADS` times that capacity, reached by replicating sessions (`sim.replay`)
over a `window_s` window, or by scaling a ServeGen rate. The overload level
is placed on an estimate (`capacity_rps`, a roofline over the trace's
requests with the GPU profile's iteration times); its static splits then
measure the capacity, and the lighter levels are placed on that
measurement when the best split could not keep up (`remeasured`; the row
says `capacity_measured`). What a case reached is in its results
(completed / arrived, the static splits' throughput). A case that would
exceed `max_requests` per simulation is run at the load that fits and says
so (`capped`): tiny tool-calling turns (taubench) would need millions of
requests to load 36 GPUs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sim import traces
from sim.perturb import PERTURBATIONS, load_factor, perturb
from sim.profiles import GpuProfile
from sim.scenarios import SERVEGEN_START_S, TRACES, Scenario, load_trace
from sim.workloads import Workload

LOADS = {"light": 0.3, "near": 0.85, "overload": 1.6}  # x the estimated capacity
# Stationary cases the evolving planner also starts from every split (convergence from any start).
CONVERGENCE = (
    ("mooncake/conversation_trace.jsonl", "near"),
    ("agents/aider", "near"),
    ("servegen/reason/deepseek-r1", "near"),
)
SYNTHETIC = (("shift", None), ("burst", None), ("burst", 2.0), ("lowrate", None))


@dataclass(frozen=True)
class SuiteConfig:
    """nodes: cluster size; starts: initial prefill nodes of the adaptive
    planners (two starting splits); window_s: replay window and horizon of a
    trace case; max_requests: per simulation (cost bound); seed;
    convergence: (unit, level) cases evolving also starts from every split.
    perturbations / perturb_levels: every trace case at these levels also
    runs under each perturbation (`sim.perturb`), from the first start only.
    holdout_every: the distinct trace units, sorted, alternate between the
    tuning half and the held-out half (`split_units`); the planner's
    constants are chosen on the first and reported on the second.
    units: run only the units whose name starts with one of these (every
    unit when empty; the halves stay those of all units); synthetic: the
    scenarios beside the traces; cache: a `sim.result_cache` folder."""

    nodes: int = 9
    starts: tuple[int, ...] = (3, 6)
    window_s: float = 1_800.0
    max_requests: int = 90_000
    seed: int = 0
    loads: tuple[tuple[str, float], ...] = tuple(LOADS.items())
    synthetic: tuple[tuple[str, float | None], ...] = SYNTHETIC
    traces_root: Path = TRACES
    convergence: tuple[tuple[str, str], ...] = CONVERGENCE
    perturbations: tuple[str, ...] = tuple(PERTURBATIONS)
    perturb_levels: tuple[str, ...] = tuple(LOADS)
    units: tuple[str, ...] = ()
    cache: Path | None = None

    def __post_init__(self) -> None:
        unknown = [p for p in self.perturbations if p not in PERTURBATIONS]
        if unknown:
            raise ValueError(f"unknown perturbation(s) {', '.join(unknown)}; known: {', '.join(PERTURBATIONS)}")
        if self.nodes < 2 or not self.starts or any(not 1 <= s < self.nodes for s in self.starts):
            raise ValueError("need nodes >= 2 and every start in [1, nodes - 1]")
        if self.window_s <= 0 or self.max_requests < 1 or any(u <= 0 for _, u in self.loads):
            raise ValueError("window_s, max_requests and every load must be > 0")


def discover(root: Path) -> list[Path]:
    """Trace units under `root` (module doc), sorted."""
    units: list[Path] = []
    for folder in sorted({p.parent for p in root.rglob("*") if p.suffix in (".jsonl", ".csv")}):
        if any(folder.glob("chunk-*-trace.csv")):
            units.append(folder)
            continue
        files = sorted(p for p in folder.iterdir() if p.suffix in (".jsonl", ".csv"))
        nonempty = [p for p in files if p.stat().st_size > 0]
        if (
            files
            and all(p.suffix == ".jsonl" for p in files)
            and nonempty
            and traces.trace_format(nonempty[0]) == "agent-text"
        ):
            units.append(folder)
            continue
        units += [p for p in files if p.stat().st_size > 0]
    return units


def canonical(wl: Workload) -> Workload:
    """Block ids renumbered by first appearance (equality kept): the same
    workload read from text or from its converted file is then identical."""
    ids: dict[int, int] = {}
    reqs = tuple(
        replace(r, block_hashes=tuple(ids.setdefault(h, len(ids)) for h in r.block_hashes)) for r in wl.requests
    )
    return replace(wl, requests=reqs, notes=())


def fingerprint(wl: Workload) -> int:
    """Equal for workloads that differ only in block id names and in the
    exact times (a converted file's timestamps vs the text's: taubench's
    differ by tens of microseconds, so any rounding splits some pair): the
    requests in arrival order, each with its session, tokens, blocks and
    dependencies, and the window."""
    c = canonical(wl)
    rows = tuple(
        (r.session_id.split(":")[-1], r.prompt_tokens, r.output_tokens, r.block_hashes, r.after) for r in c.requests
    )
    return hash((round(c.duration_s, 3), c.block_tokens, c.closed_loop, rows))


def capacity_rps(wl: Workload, gpu: GpuProfile, nodes: int) -> float:
    """Roofline estimate of the requests/s `nodes` nodes serve of this mix at
    the best fluid split: node-seconds of prefill (prefix reuse within the
    trace taken as cached, prompts batched to the token budget) plus decode
    (batch bounded by KV at prompt + output per request) per request."""
    (a, b, c, d), (da, db, dc) = gpu.model.prefill, gpu.model.decode
    cfg, bt = gpu.node, wl.block_tokens
    seen: set[int] = set()
    work = []
    for r in wl.requests:
        hit = 0
        for h in r.block_hashes:
            if h not in seen:
                break
            hit += 1
        seen.update(r.block_hashes)
        cached = min(hit * bt, r.prompt_tokens - 1)
        u = r.prompt_tokens - cached
        k = max(1, cfg.chunk_tokens // max(u, 1))
        pre = (a / k + b * u + c * cached + d * u * (u + cached) / 1e4) / 1000.0
        batch = max(1.0, min(cfg.max_batch, cfg.kv_capacity_tokens / (r.prompt_tokens + r.output_tokens)))
        ctx = r.prompt_tokens + r.output_tokens / 2
        dec = r.output_tokens * (da + db * batch + dc * batch * ctx) / batch / 1000.0
        work.append(pre + dec)
    return nodes / float(np.mean(work)) if work else 0.0


@dataclass(frozen=True)
class TraceCase:
    """One (unit, load) of the suite: what to build in a worker process."""

    unit: str  # path relative to the traces root
    level: str
    load: float  # sessions x (or rate x) the trace
    capacity_rps: float
    offered_rps: float
    capped: bool
    measured: bool = False  # capacity_rps measured by the overload case's static splits (`remeasured`)
    perturbation: str | None = None  # `sim.perturb` name; `load` already includes its load factor


def perturbed_cases(cfg: SuiteConfig, case: TraceCase) -> tuple[list[TraceCase], list[str]]:
    """The case under each of the suite's perturbations that has a form for
    it, and the names of those that have none (`sim.perturb.perturb` gives
    None: no closed form, no turn past the first, no fork)."""
    if case.level not in cfg.perturb_levels:
        return [], []
    out, without = [], []
    for name in cfg.perturbations:
        if PERTURBATIONS[name] is not None and perturb(_workload(cfg, case.unit, case.load), name, cfg.seed) is None:
            without.append(name)
            continue
        load = round(case.load * load_factor(name, LOADS.get(case.level, 1.0)), 4)
        out.append(replace(case, perturbation=name, load=load))
    return out, without


def split_units(units: list[str]) -> tuple[list[str], list[str]]:
    """(tuning, held-out) halves of the distinct units: sorted, alternating.
    Fixed by the names alone, so no result can move a unit between halves."""
    ordered = sorted(set(units))
    return ordered[0::2], ordered[1::2]


def plan_trace_cases(cfg: SuiteConfig, gpu: GpuProfile) -> tuple[list[TraceCase], dict[str, str], list[str]]:
    """Cases per distinct unit picked by `cfg.units`, {duplicate unit: the
    unit it repeats}, and every distinct unit (picked or not: the halves)."""
    cases: list[TraceCase] = []
    same: dict[str, str] = {}
    seen: dict[int, str] = {}
    for path in discover(cfg.traces_root):
        unit = str(path.relative_to(cfg.traces_root))
        base = _base(cfg, unit)
        key = fingerprint(base)
        if key in seen:
            same[unit] = seen[key]
            continue
        seen[key] = unit
        if cfg.units and not unit.startswith(cfg.units):
            continue
        cases += unit_cases(cfg, unit, len(base.requests), capacity_rps(base, gpu, cfg.nodes), cfg.loads)
    return cases, same, list(seen.values())


def unit_cases(
    cfg: SuiteConfig, unit: str, requests: int, cap: float, loads: tuple[tuple[str, float], ...], measured: bool = False
) -> list[TraceCase]:
    """The unit's cases at `loads` x `cap` (requests/s), `requests` being
    its request count at load 1 over the window; capped as the module doc says."""
    cases: list[TraceCase] = []
    rate = requests / cfg.window_s
    for level, u in loads:
        load = u * cap / rate if rate > 0 else 1.0
        capped = load * requests > cfg.max_requests
        if capped:
            load = cfg.max_requests / requests
        if capped and cases and cases[-1].capped:
            continue  # a higher level capped to the same load: nothing new to run
        cases.append(TraceCase(unit, level, round(load, 4), cap, load * rate, capped, measured))
    return cases


SATURATED = 0.9  # the best static split finished less than this of what arrived: its throughput is the capacity


def remeasured(cfg: SuiteConfig, case: TraceCase, best_rps: float, best_completed: float) -> list[TraceCase] | None:
    """The levels below `case` (the unit's overload case) placed on the
    capacity its static splits measured, `best_rps`, when the best of them
    could not keep up (finished < `SATURATED` of the arrivals: its
    throughput is what the cluster serves of this mix); None when it kept
    up (the estimate then stands). The roofline estimate takes every
    reused prefix as cached and splits nodes fluidly: on Mooncake's
    synthetic trace it said 34 req/s where the best split served 26, so
    "near" (0.85x) was in fact 1.3x overload."""
    if best_completed >= SATURATED or best_rps <= 0:
        return None
    below = tuple((level, u) for level, u in cfg.loads if level != case.level)
    return unit_cases(cfg, case.unit, len(_base(cfg, case.unit).requests), best_rps, below, measured=True)


@functools.lru_cache(maxsize=4)
def _base(cfg: SuiteConfig, unit: str) -> Workload:
    """The unit at load 1 over the suite window (ServeGen: its hour-10 slice)."""
    return _workload(cfg, unit, 1.0)


@functools.lru_cache(maxsize=8)
def _workload(cfg: SuiteConfig, unit: str, load: float) -> Workload:
    path = cfg.traces_root / unit
    if traces.trace_format(path) == "servegen":
        wl = traces.load_servegen(
            path, seed=cfg.seed, duration_s=cfg.window_s, start_s=SERVEGEN_START_S, rate_scale=load
        )
    else:
        wl = load_trace(path, seed=cfg.seed, load=load, duration_s=cfg.window_s, spread_s=cfg.window_s)
    return canonical(wl)


def trace_scenario(cfg: SuiteConfig, case: TraceCase, start: int) -> Scenario:
    wl = _workload(cfg, case.unit, case.load)
    if case.perturbation is not None:
        changed = perturb(wl, case.perturbation, cfg.seed)
        if changed is None:
            raise ValueError(f"{case.unit}: {case.perturbation} has no form for this trace")
        wl = changed
    name = f"{case.unit} {case.level}" + (f" [{case.perturbation}]" if case.perturbation else "")
    return Scenario("trace", wl, cfg.nodes, start, name)
