"""`evolving-infra simulate`: run planners on a scenario in the simulator.

    evolving-infra simulate --scenario shift --planner all --json --plot out.png

JSON: {"scenario", "nodes", "gpus", "results": {"evolving": {...},
"static_best": {..., "split": [p, d]}, "dynamo": {...}}, "ratios":
{"vs_static_best", "vs_dynamo"}} with throughput ratios (evolving / other).
`fixed-4p5d` instead compares KV loading: results {"async", "layerwise"}.

`--oracle` adds a clairvoyant reference: the run is cut into
`--oracle-segments` equal segments and, segment by segment, every split is
tried with the earlier segments' choices fixed, keeping the one that has
finished the most requests by the segment's end (greedy; a switch costs
what an in-place switch costs). It says how much any planner could gain on
the scenario; results["oracle"]["schedule"] is the table it found.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sim.cluster import Cluster, SimConfig
from sim.profiles import DEFAULT_PROFILE, GpuProfile
from sim.scenarios import SCENARIOS, Scenario, build


def _planner(name: str, gpu: GpuProfile, prefill_nodes: int):
    from planner.registry import make_planner

    if name == "evolving":
        return make_planner("evolving", profile=gpu.planner_profile())
    if name == "dynamo":
        return make_planner("dynamo")
    if name == "static":
        return make_planner("static", prefill_nodes=prefill_nodes)
    if name == "none":
        return None
    if name.startswith("schedule:"):  # "schedule:0=2,3600=5" (picklable for the process pool)
        pairs = [item.split("=") for item in name.split(":", 1)[1].split(",")]
        return make_planner("schedule", schedule=[(float(t), int(p)) for t, p in pairs])
    raise ValueError(name)


def _schedule_spec(schedule: list[tuple[float, int]]) -> str:
    return "schedule:" + ",".join(f"{t:g}={p}" for t, p in schedule)


def _run_all(tasks: list[tuple], jobs: int) -> list[dict[str, Any]]:
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(run_one, tasks))
    return [run_one(t) for t in tasks]


def oracle_search(
    sc: Scenario, *, seed: int, profile: str, jobs: int, extra: dict[str, Any], segments: int
) -> dict[str, Any]:
    """Greedy clairvoyant schedule (module doc); the full run of the best table."""
    if segments < 1:
        raise ValueError("segments must be >= 1")
    horizon = sc.workload.duration_s
    width = horizon / segments
    schedule: list[tuple[float, int]] = []
    best: dict[str, Any] = {}
    for i in range(segments):
        start, end = i * width, horizon if i == segments - 1 else (i + 1) * width
        splits = list(range(1, sc.nodes))
        tables = [schedule + [(start, p)] for p in splits]
        outs = _run_all(
            [(sc, _schedule_spec(t), profile, t[0][1], seed, {**extra, "horizon_s": end}) for t in tables], jobs
        )
        k = max(range(len(splits)), key=lambda j: (outs[j]["completed"], -outs[j]["mean_e2e_s"]))
        schedule, best = tables[k], outs[k]
    return {**best, "schedule": [[t, p] for t, p in schedule]}


def run_one(args: tuple[Scenario, str, str, int, int, dict[str, Any]]) -> dict[str, Any]:
    """One simulation: (scenario, planner, profile path, prefill_nodes, seed, extra SimConfig fields)."""
    sc, planner, profile_path, p, seed, extra = args
    gpu = GpuProfile.from_json(profile_path)
    t0 = time.perf_counter()
    cfg = SimConfig(nodes=sc.nodes, prefill_nodes=p, seed=seed, **extra)
    log = Cluster(sc.workload, gpu, _planner(planner, gpu, p), cfg).run()
    out = log.summary()
    out["initial_split"] = [p, sc.nodes - p]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["events"] = log.events_processed
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


def simulate(
    sc: Scenario,
    planners: list[str],
    *,
    seed: int,
    profile: str,
    jobs: int,
    extra: dict[str, Any],
    oracle_segments: int = 3,
) -> dict[str, Any]:
    n = sc.nodes
    gpu = GpuProfile.from_json(profile)
    tasks: dict[str, tuple] = {}
    if sc.name == "fixed-4p5d":
        for name, lw in (("async", False), ("layerwise", True)):
            tasks[name] = (sc, "none", profile, 4, seed, {**extra, "layerwise_kv": lw})
    else:
        if "evolving" in planners:
            tasks["evolving"] = (sc, "evolving", profile, sc.prefill_nodes, seed, extra)
        if "dynamo" in planners:
            tasks["dynamo"] = (sc, "dynamo", profile, sc.prefill_nodes, seed, extra)
        if "static-best" in planners:
            for p in range(1, n):
                tasks[f"static:{p}"] = (sc, "static", profile, p, seed, extra)
    names = list(tasks)
    res = dict(zip(names, _run_all([tasks[k] for k in names], jobs), strict=True))
    if "oracle" in planners and sc.name != "fixed-4p5d":
        res["oracle"] = oracle_search(sc, seed=seed, profile=profile, jobs=jobs, extra=extra, segments=oracle_segments)
    results: dict[str, Any] = {k: v for k, v in res.items() if not k.startswith("static:")}
    statics = {int(k.split(":")[1]): v for k, v in res.items() if k.startswith("static:")}
    if statics:
        best = max(statics, key=lambda p: (statics[p]["throughput_rps"], -statics[p]["mean_e2e_s"]))
        results["static_best"] = {
            **statics[best],
            "split": [best, n - best],
            "all_splits": {str(p): statics[p]["throughput_rps"] for p in sorted(statics)},
        }
    ratios: dict[str, float | None] = {}
    if "evolving" in results:
        ev = results["evolving"]["throughput_rps"]
        if "static_best" in results:
            ratios["vs_static_best"] = _ratio(ev, results["static_best"]["throughput_rps"])
            ratios["e2e_vs_static_best"] = _ratio(
                results["static_best"]["mean_e2e_s"], results["evolving"]["mean_e2e_s"]
            )
        if "dynamo" in results:
            ratios["vs_dynamo"] = _ratio(ev, results["dynamo"]["throughput_rps"])
            ratios["e2e_vs_dynamo"] = _ratio(results["dynamo"]["mean_e2e_s"], results["evolving"]["mean_e2e_s"])
        if "oracle" in results:
            ratios["vs_oracle"] = _ratio(ev, results["oracle"]["throughput_rps"])
    if "async" in results and "layerwise" in results:
        lw = results["layerwise"]["prefill_idle_fraction"]
        ratios["idle_fraction_reduction"] = round(1 - results["async"]["prefill_idle_fraction"] / lw, 4) if lw else None
    if "oracle" in results and "static_best" in results:
        ratios["oracle_vs_static_best"] = _ratio(
            results["oracle"]["throughput_rps"], results["static_best"]["throughput_rps"]
        )
    return {
        "scenario": sc.name,
        "note": sc.note,
        "nodes": n,
        "gpus": n * gpu.gpus_per_node,
        "profile": gpu.name,
        "requests": len(sc.workload.requests),
        "seed": seed,
        "results": results,
        "ratios": ratios,
    }


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name, r in report["results"].items():
        s = r["split_over_time"]
        if s:
            ax1.step([x[0] / 60 for x in s], [x[1] for x in s], where="post", label=f"{name} prefill nodes")
        w = r["window_s"]
        tp = r["throughput_by_window_rps"]
        ax2.plot([(i + 0.5) * w / 60 for i in range(len(tp))], tp, marker=".", label=name)
    ax1.set_ylabel("prefill nodes")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("finished requests / s")
    ax2.set_xlabel("minutes")
    ax2.legend(fontsize=8)
    fig.suptitle(f"simulate {report['scenario']}: {report['nodes']} nodes ({report['gpus']} GPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolving-infra simulate", description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=SCENARIOS, required=True)
    ap.add_argument("--trace", help="replace the scenario's generated workload by this trace file")
    ap.add_argument("--planner", default="all", choices=["evolving", "static-best", "dynamo", "all"])
    ap.add_argument("--oracle", action="store_true", help="also search the clairvoyant split table (costly)")
    ap.add_argument("--oracle-segments", type=int, default=3, help="segments of the oracle's split table")
    ap.add_argument("--nodes", type=int, help="nodes (each gpus_per_node GPUs of the profile)")
    ap.add_argument("--duration", type=float, help="seconds of workload (scenario default otherwise)")
    ap.add_argument("--load", type=float, default=1.0, help="multiply the scenario's agent count / rate")
    ap.add_argument("--mix", choices=["coding", "cu", "math"], help="fixed-4p5d: the agents' kind (default coding)")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE), help="GPU profile JSON")
    ap.add_argument(
        "--directory",
        choices=["memory", "local"],
        default="memory",
        help="memory: kvpool's in-memory directory; local: the simulator's faster index",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="parallel simulations")
    ap.add_argument("--json", action="store_true", help="print the JSON report")
    ap.add_argument("--full", action="store_true", help="keep per-window series in the JSON")
    ap.add_argument("--plot", help="write split-over-time and throughput PNG here")
    a = ap.parse_args(argv)
    planners = ["evolving", "static-best", "dynamo"] if a.planner == "all" else [a.planner]
    planners += ["oracle"] if a.oracle else []
    t0 = time.perf_counter()
    try:
        sc = build(
            a.scenario, seed=a.seed, nodes=a.nodes, trace=a.trace, duration_s=a.duration, scale=a.load, mix=a.mix
        )
    except ValueError as e:
        ap.error(str(e))
    report = simulate(
        sc,
        planners,
        seed=a.seed,
        profile=a.profile,
        jobs=a.jobs,
        extra={"directory": a.directory},
        oracle_segments=a.oracle_segments,
    )
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    if a.plot:
        plot(report, a.plot)
    if not a.full:
        for r in report["results"].values():
            for k in ("split_over_time", "p95_ttft_by_window_s", "throughput_by_window_rps"):
                r.pop(k, None)
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        for name, r in report["results"].items():
            print(
                f"{name:12s} thr={r['throughput_rps']:.3f} rps  e2e={r['mean_e2e_s']:.1f}s  "
                f"p95ttft={r['p95_ttft_s']:.2f}s  switches={r['switches']}"
            )
        print("ratios", report["ratios"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
