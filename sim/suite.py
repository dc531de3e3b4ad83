"""`simulate --suite`: every trace at three loads from two starting splits,
plus the synthetic scenarios; evolving against the best static split (chosen
in hindsight: every split is run; `best_split` breaks ties in served by mean
response) and the Dynamo-like planner.

    evolving-infra simulate --suite --jobs 2 --json

Prints `{"cases": [...], "min_vs_static_best": x, "min_vs_dynamo": y,
"flaps": n, ...}`. A case row: the unit or scenario, its load, the starting
split, evolving's numbers (served and raw throughput, goodput, completed /
arrived, mean E2E over all requests, switches, flaps), the best static
split's and Dynamo's, the two ratios (evolving / other) by `served`,
`vs_static_best_throughput` (by requests finished, against the static
split that finished the most), and `settled_s`:
when evolving's split last entered the splits whose static throughput is
within 2 % of the best one (None: it ended outside them). The cases are in
`sim.suite_cases`; each unit's overload case runs first (`_probe`): its
static splits measure the capacity the lighter levels are placed on.

Planners are compared by `served` (`sim.metrics`): how many of the
requests that arrived up to 300 s before the horizon finished by it. Raw
throughput (finished by the horizon / horizon) is in every row beside it;
on a light load it differs between two planners that both serve everything
by the few requests that straddle the horizon.

Cross-validation (issue 33): the distinct trace units alternate, sorted,
between a tuning half and a held-out half (`suite_cases.split_units`);
`min_vs_static_best_tuning` / `_holdout` report each half (synthetic
scenarios count as tuning). Every trace case also runs perturbed
(`sim.perturb`: outputs x0.5 / x2, contexts growing, sub-agent fan-out,
the loop flipped, 3x overload) from the first start, with every static
split and Dynamo-like: `min_vs_static_best_perturbed`; a perturbation
that has no form for a case (a trace without block ids has no turns to
grow or fork) is listed in `perturbations_without_form`. `reverted_moves`
sums the moves evolving reverted after checking them
(`planner.verification`); `moves_from_best_start` the moves evolving made
on the stationary cases (light and near) when started at their best
static split, where staying put is right.

Throughput under heavy overload depends on the path: which requests sit
at the head of which queue when the horizon ends, which prefixes each
node's cache holds. `placebo_vs_static_best` measures that per case: the
best static split run again with one node switched away for 10 s at
mid-run. `below_target_beyond_placebo` lists the cases short of a target
by more than their placebo moved.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from sim import result_cache
from sim.perturb import load_factor
from sim.profiles import GpuProfile
from sim.runs import run_all, run_one
from sim.scenarios import Scenario, build
from sim.suite_cases import (
    LOADS,
    SuiteConfig,
    TraceCase,
    perturbed_cases,
    plan_trace_cases,
    remeasured,
    split_units,
    trace_scenario,
)

NEAR_BEST = 0.98  # a split within this of the best static one counts as converged

Spec = tuple[str, Any, Any]  # ("trace", case, None) | ("synthetic", name, load)


def _scenario(cfg: SuiteConfig, spec: Spec, start: int | None) -> Scenario:
    kind, a, b = spec
    if kind == "trace":
        return trace_scenario(cfg, a, start if start is not None else cfg.starts[0])
    sc = build(a, seed=cfg.seed, nodes=cfg.nodes, scale=b)
    return sc if start is None else Scenario(sc.name, sc.workload, sc.nodes, start, sc.note)


def _what(cfg: SuiteConfig, spec: Spec, p: int, extra: dict[str, Any]) -> str:
    """The run's identity for `sim.result_cache`, its planner aside."""
    settings = (cfg.nodes, cfg.seed, cfg.window_s, cfg.max_requests, str(cfg.traces_root), sorted(extra.items()))
    return repr((spec, p, settings))


def _task(args: tuple[SuiteConfig, Spec, str, int, str, dict[str, Any]]) -> dict[str, Any]:
    cfg, spec, planner, p, profile, extra = args
    t0 = time.perf_counter()
    key = result_cache.task_key(_what(cfg, spec, p, extra), planner, profile) if cfg.cache is not None else ""
    kept = result_cache.load(cfg.cache, key) if cfg.cache is not None else None
    if kept is not None:
        return kept
    sc = _scenario(cfg, spec, p)
    out = run_one((sc, planner, profile, p, cfg.seed, extra))
    if cfg.cache is not None:
        result_cache.store(cfg.cache, key, out)
    # Progress on stderr (the JSON comes at the end): how far a suite that ran out of time got.
    name = spec[1] if spec[0] == "synthetic" else f"{spec[1].unit} {spec[1].level} {spec[1].perturbation or ''}"
    print(f"suite: {name} {planner} {p}P {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


Task = tuple[SuiteConfig, Spec, str, int, str, dict[str, Any]]
METRIC = "served"  # what the suite compares planners by (sim.metrics: the horizon's straddlers left out)


def _probe(
    cfg: SuiteConfig, cases: list[TraceCase], *, profile: str, jobs: int, extra: dict[str, Any]
) -> tuple[list[TraceCase], dict[int, dict[int, dict[str, Any]]]]:
    """Run every static split of each unit's overload case first and place
    the unit's lighter levels on the capacity they measured
    (`suite_cases.remeasured`). Returns the cases to run and the results
    already in hand, {id(case): {prefill nodes: result}}."""
    probes = [c for c in cases if c.level == "overload"]
    tasks: list[Task] = [
        (cfg, ("trace", c, None), "static", p, profile, extra) for c in probes for p in range(1, cfg.nodes)
    ]
    outs = iter(run_all(_task, tasks, jobs))
    done: dict[int, dict[int, dict[str, Any]]] = {}
    replan: dict[str, list[TraceCase]] = {}
    for c in probes:
        statics = {p: next(outs) for p in range(1, cfg.nodes)}
        done[id(c)] = statics
        best = max(statics.values(), key=lambda r: r[METRIC])
        new = remeasured(cfg, c, best["throughput_rps"], best["completed_fraction"] or 0.0)
        if new is not None:
            replan[c.unit] = [*new, c]
    out: list[TraceCase] = []
    for c in cases:
        if c.unit not in replan:
            out.append(c)
        elif c.level == "overload":
            out += replan[c.unit]
    return out, done


Group = tuple[Spec, list[int], dict[str, Any]]  # a case, its starting splits, {"nodes", "horizon_s", ...}
Runs = dict[tuple[int, str, int], dict[str, Any]]  # (group, planner, prefill nodes) -> result


def run_suite(cfg: SuiteConfig, *, profile: str, jobs: int, extra: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    gpu = GpuProfile.from_json(profile)
    planned, same, every_unit = plan_trace_cases(cfg, gpu)
    trace_cases, probed = _probe(cfg, planned, profile=profile, jobs=jobs, extra=extra)
    groups, without_form = _groups(cfg, trace_cases)
    by, ran = _main_runs(cfg, groups, probed, profile=profile, jobs=jobs, extra=extra)
    placebos, more = _placebo_runs(cfg, groups, by, profile=profile, jobs=jobs, extra=extra)
    tuning, holdout = split_units(every_unit)
    cases = _rows(groups, by, placebos, same, tuning)
    from_best = _moves_from_best(groups, by)
    return {
        "cases": cases,
        **_summary(cases, _convergences(groups, by)),
        "tuning_units": tuning,
        "holdout_units": holdout,
        "perturbations": list(cfg.perturbations),
        "perturbations_without_form": without_form,
        **_totals(cases),
        "moves_from_best_start": sum(from_best.values()),
        "moves_from_best_start_cases": from_best,
        "below_target": [c["case"] for c in cases if (c["vs_static_best"] or 0) < 0.98 or (c["vs_dynamo"] or 0) < 1.0],
        "below_target_beyond_placebo": [c["case"] for c in cases if _beyond_noise(c)],
        "metric": METRIC,
        "same_workload": same,
        "simulations": ran + more + sum(len(v) for v in probed.values()),
        "jobs": jobs,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def _groups(cfg: SuiteConfig, trace_cases: list[TraceCase]) -> tuple[list[Group], list[str]]:
    """The synthetic scenarios, the trace cases, then their perturbed forms
    (from the first start only); and the perturbations without a form."""
    groups: list[Group] = []
    for name, load in cfg.synthetic:
        sc = build(name, seed=cfg.seed, nodes=cfg.nodes, scale=load)
        groups.append(
            (("synthetic", name, load), [sc.prefill_nodes], {"nodes": sc.nodes, "horizon_s": sc.workload.duration_s})
        )
    every = set(cfg.convergence)
    for case in trace_cases:
        info = {"nodes": cfg.nodes, "every_start": (case.unit, case.level) in every, "horizon_s": cfg.window_s}
        groups.append((("trace", case, None), list(cfg.starts), info))
    forms, without_form = perturbed_specs(cfg, trace_cases)
    for pc in forms:
        groups.append((("trace", pc, None), [cfg.starts[0]], {"nodes": cfg.nodes, "horizon_s": cfg.window_s}))
    return groups, without_form


def _main_runs(
    cfg: SuiteConfig,
    groups: list[Group],
    probed: dict[int, dict[int, dict[str, Any]]],
    *,
    profile: str,
    jobs: int,
    extra: dict[str, Any],
) -> tuple[Runs, int]:
    """Every static split of each group (those `_probe` ran are reused),
    evolving and Dynamo-like from its starts, evolving from every other
    split where the group asks for convergence; the runs and how many ran."""
    tasks: list[Task] = []
    index: list[tuple[int, str, int]] = []
    by: Runs = {}
    for g, (spec, starts, info) in enumerate(groups):
        known = probed.get(id(spec[1]), {}) if spec[0] == "trace" else {}
        for p in range(1, info["nodes"]):
            if p in known:
                by[(g, "static", p)] = known[p]
            else:
                tasks.append((cfg, spec, "static", p, profile, extra))
                index.append((g, "static", p))
            if info.get("every_start") and p not in starts:  # convergence from any start
                tasks.append((cfg, spec, "evolving", p, profile, extra))
                index.append((g, "evolving", p))
        for p in starts:
            for planner in ("evolving", "dynamo"):
                tasks.append((cfg, spec, planner, p, profile, extra))
                index.append((g, planner, p))
    by.update(zip(index, run_all(_task, tasks, jobs), strict=True))
    return by, len(tasks)


def _statics(g: int, info: dict[str, Any], by: Runs) -> dict[int, dict[str, Any]]:
    return {p: by[(g, "static", p)] for p in range(1, info["nodes"])}


def _placebo_runs(
    cfg: SuiteConfig, groups: list[Group], by: Runs, *, profile: str, jobs: int, extra: dict[str, Any]
) -> tuple[dict[int, dict[str, Any]], int]:
    """Placebo: the best static split with one node away for 10 s at
    mid-run, per unperturbed group ({group: result}); how far that alone
    moves throughput is how far the case's measurement can be trusted
    (queue-order chaos). With them, evolving started at the best static
    split of each stationary case (staying put is right there), added to
    `by`. Returns the placebos and how many runs both took."""
    placebo_tasks: list[Task] = []
    best_tasks: list[Task] = []
    placebo_of: dict[int, int] = {}
    best_of: dict[int, int] = {}
    for g, (spec, _, info) in enumerate(groups):
        best = best_split(_statics(g, info, by))
        if _stationary(spec) and (g, "evolving", best) not in by:
            best_of[g] = len(best_tasks)
            best_tasks.append((cfg, spec, "evolving", best, profile, extra))
        if _perturbation(spec) is not None:
            continue
        mid = round(info["horizon_s"] / 2.0)
        other = best - 1 if best > 1 else best + 1
        placebo_of[g] = len(placebo_tasks)
        placebo_tasks.append((cfg, spec, f"schedule:0={best},{mid}={other},{mid + 10}={best}", best, profile, extra))
    outs = run_all(_task, placebo_tasks + best_tasks, jobs)
    for g, k in best_of.items():
        by[(g, "evolving", best_tasks[k][3])] = outs[len(placebo_tasks) + k]
    return {g: outs[k] for g, k in placebo_of.items()}, len(placebo_tasks) + len(best_tasks)


def _rows(
    groups: list[Group],
    by: Runs,
    placebos: dict[int, dict[str, Any]],
    same: dict[str, str],
    tuning: list[str],
) -> list[dict[str, Any]]:
    """One row per group and start (`_row`), with its placebo, perturbation and half."""
    cases = []
    for g, (spec, starts, info) in enumerate(groups):
        statics = _statics(g, info, by)
        top = max(r[METRIC] for r in statics.values())
        for start in starts:
            row = _row(spec, start, statics, by[(g, "evolving", start)], by[(g, "dynamo", start)], same)
            row["placebo_vs_static_best"] = _ratio(placebos[g][METRIC], top) if g in placebos else None
            row["perturbation"] = _perturbation(spec)
            row["half"] = "tuning" if spec[0] == "synthetic" or spec[1].unit in tuning else "holdout"
            cases.append(row)
    return cases


def _convergences(groups: list[Group], by: Runs) -> list[dict[str, Any]]:
    return [
        _convergence(spec, _statics(g, info, by), by, g)
        for g, (spec, _, info) in enumerate(groups)
        if info.get("every_start")
    ]


def _moves_from_best(groups: list[Group], by: Runs) -> dict[str, int]:
    """Evolving's moves on each stationary case when started at its best static split."""
    from_best = {}
    for g, (spec, _, info) in enumerate(groups):
        best = best_split(_statics(g, info, by))
        if _stationary(spec):
            from_best[f"{spec[1].unit} {spec[1].level} from {best}P"] = by[(g, "evolving", best)]["moves"]
    return from_best


def _summary(cases: list[dict[str, Any]], convergence: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst ratios: over the base cases, each half, the perturbed cases and all."""
    base = [c for c in cases if c["perturbation"] is None]
    perturbed = [c for c in cases if c["perturbation"] is not None]
    settled = [c["max_settled_s"] for c in convergence]
    return {
        "convergence": convergence,
        "max_settled_s": None if None in settled else max(settled, default=None),
        "min_vs_static_best": _min(base, "vs_static_best"),
        "min_vs_dynamo": _min(base, "vs_dynamo"),
        "min_vs_static_best_tuning": _min([c for c in base if c["half"] == "tuning"], "vs_static_best"),
        "min_vs_static_best_holdout": _min([c for c in base if c["half"] == "holdout"], "vs_static_best"),
        "min_vs_dynamo_holdout": _min([c for c in base if c["half"] == "holdout"], "vs_dynamo"),
        "min_vs_static_best_perturbed": _min(perturbed, "vs_static_best"),
        "min_vs_dynamo_perturbed": _min(perturbed, "vs_dynamo"),
        "min_vs_static_best_all": _min(cases, "vs_static_best"),
    }


def _totals(cases: list[dict[str, Any]]) -> dict[str, int]:
    """Evolving's flaps, switches and checked moves over every case."""
    out = {key: sum(c["evolving"][key] for c in cases) for key in ("flaps", "switches")}
    for key in ("verified_moves", "delivered_moves", "reverted_moves"):
        out[key] = sum(c["evolving"][key] or 0 for c in cases)
    return out


def perturbed_specs(cfg: SuiteConfig, cases: list[TraceCase]) -> tuple[list[TraceCase], list[str]]:
    """The cases' perturbed forms (`suite_cases.perturbed_cases`) and
    those without one. A workload two levels reach is run once:
    `overload_3x` is 3x the capacity a level was placed on, so the levels
    placed on one capacity (light and near once remeasured, or every level
    on the estimate) give the same case under two names."""
    out: list[TraceCase] = []
    without: list[str] = []
    seen: set[tuple[str, str | None, float]] = set()
    for case in cases:
        forms, missing = perturbed_cases(cfg, case)
        without += [f"{case.unit} {case.level} [{name}]" for name in missing]
        for pc in forms:
            rate = case.offered_rps * load_factor(str(pc.perturbation), LOADS.get(case.level, 1.0))
            key = (pc.unit, pc.perturbation, round(rate, 3))
            if key not in seen:
                seen.add(key)
                out.append(pc)
    return out, without


def best_split(statics: dict[int, dict[str, Any]]) -> int:
    """The best static split: most served, and among splits that serve the
    same, the shortest mean response (over all requests). Below capacity
    several splits serve every request; the planner then picks by response
    time, so that is where staying put is right: on Mooncake conversation
    near, 5P, 6P and 7P all serve 26,375, with means of 122 s, 12 s and 11 s."""
    return max(statics, key=lambda p: (statics[p][METRIC], -statics[p]["mean_e2e_all_s"]))


def _min(rows: list[dict[str, Any]], key: str) -> float | None:
    return min((r[key] for r in rows if r[key] is not None), default=None)


def _perturbation(spec: Spec) -> str | None:
    return spec[1].perturbation if spec[0] == "trace" else None


def _stationary(spec: Spec) -> bool:
    """A trace case at a steady load below capacity, unperturbed: the best
    static split is where a planner should stay."""
    return spec[0] == "trace" and spec[1].level in ("light", "near") and spec[1].perturbation is None


def _beyond_noise(c: dict[str, Any]) -> bool:
    """Below 0.98 of the best static split by more than its placebo moved it."""
    noise = abs(1.0 - (c["placebo_vs_static_best"] or 1.0))
    return (c["vs_static_best"] or 0.0) < 0.98 - noise or (c["vs_dynamo"] or 0.0) < 1.0 - noise


def _convergence(
    spec: Spec, statics: dict[int, dict[str, Any]], by: dict[tuple[int, str, int], dict[str, Any]], g: int
) -> dict[str, Any]:
    """Evolving from every starting split of one stationary case: when it
    settled within 2 % of the best static split, and its throughput ratio."""
    case: TraceCase = spec[1]
    top = max(r[METRIC] for r in statics.values())
    near = {p for p, r in statics.items() if r[METRIC] >= NEAR_BEST * top}
    runs = {p: by[(g, "evolving", p)] for p in statics}
    settled = {str(p): _settled(r["split_over_time"], near) for p, r in runs.items()}
    return {
        "case": f"{case.unit} {case.level}",
        "near_best_splits": sorted(near),
        "settled_s": settled,
        "max_settled_s": None if None in settled.values() else max(v for v in settled.values() if v is not None),
        "vs_static_best": {str(p): _ratio(r[METRIC], top) for p, r in runs.items()},
        "flaps": sum(r["flaps"] for r in runs.values()),
    }


def _row(
    spec: Spec,
    start: int,
    statics: dict[int, dict[str, Any]],
    ev: dict[str, Any],
    dyn: dict[str, Any],
    same: dict[str, str],
) -> dict[str, Any]:
    kind, a, b = spec
    n = len(statics) + 1
    best = best_split(statics)
    top = statics[best][METRIC]
    near = {p for p, r in statics.items() if r[METRIC] >= NEAR_BEST * top}
    row: dict[str, Any] = {"case": "", "start": [start, n - start]}
    if kind == "trace":
        case: TraceCase = a
        tag = f" [{case.perturbation}]" if case.perturbation else ""
        row["case"] = f"{case.unit} {case.level} from {start}P{tag}"
        row.update(
            trace=case.unit,
            level=case.level,
            load=case.load,
            offered_rps_nominal=round(case.offered_rps, 3),
            capacity_rps_estimate=round(case.capacity_rps, 3),
            capped=case.capped,
            capacity_measured=case.measured,
            also=sorted(u for u, v in same.items() if v == case.unit),
        )
    else:
        row["case"] = f"{a}" + (f" --load {b:g}" if b is not None else "")
        row.update(scenario=a, load=b)
    row.update(
        requests=ev["arrived"],
        evolving=_keep(ev),
        static_best={**_keep(statics[best]), "split": [best, n - best]},
        static_served={str(p): statics[p][METRIC] for p in sorted(statics)},
        dynamo=_keep(dyn),
        vs_static_best=_ratio(ev[METRIC], top),
        # Finished by the horizon, whatever they arrived: in deep overload a split whose idle phase serves
        # late cache hits at once finishes more but serves fewer of the early arrivals `served` counts.
        vs_static_best_throughput=_ratio(ev["throughput_rps"], max(r["throughput_rps"] for r in statics.values())),
        vs_dynamo=_ratio(ev[METRIC], dyn[METRIC]),
        settled_s=_settled(ev["split_over_time"], near),
        final_split=ev["split_over_time"][-1][1:3] if ev["split_over_time"] else None,
    )
    return row


KEEP = (
    "served",
    "throughput_rps",
    "goodput_rps",
    "completed",
    "arrived",
    "completed_fraction",
    "mean_e2e_s",
    "mean_e2e_all_s",
    "p95_ttft_s",
    "switches",
    "moves",
    "flaps",
    "verified_moves",
    "delivered_moves",
    "reverted_moves",
    "move_checks",
    "wall_s",
)


def _keep(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in KEEP}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def _settled(split_over_time: list[list[float]], near: set[int]) -> float | None:
    """When the prefill count last entered `near` and stayed (None: it ended outside)."""
    entered: float | None = None
    for t, p, _d, other in split_over_time:
        if other:
            continue  # mid-switch samples say nothing about the split's target
        entered = (t if entered is None else entered) if p in near else None
    return entered
