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
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sim.perturb import PERTURBATIONS
from sim.profiles import DEFAULT_PROFILE, GpuProfile
from sim.runs import run_all, run_one
from sim.scenarios import SCENARIOS, TRACES, Scenario, build
from sim.suite import run_suite
from sim.suite_cases import SuiteConfig


def _schedule_spec(schedule: list[tuple[float, int]]) -> str:
    return "schedule:" + ",".join(f"{t:g}={p}" for t, p in schedule)


def _run_all(tasks: list[tuple[Any, ...]], jobs: int) -> list[dict[str, Any]]:
    return run_all(run_one, tasks, jobs)


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


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


def _tasks(
    sc: Scenario, planners: list[str], *, seed: int, profile: str, extra: dict[str, Any]
) -> dict[str, tuple[Any, ...]]:
    """One `run_one` task per planner run the scenario asks for (fixed-4p5d:
    async against layer-by-layer KV loading; static-best: every split)."""
    tasks: dict[str, tuple[Any, ...]] = {}
    if sc.name == "fixed-4p5d":
        for name, lw in (("async", False), ("layerwise", True)):
            tasks[name] = (sc, "none", profile, 4, seed, {**extra, "layerwise_kv": lw})
        return tasks
    for planner in ("evolving", "dynamo"):
        if planner in planners:
            tasks[planner] = (sc, planner, profile, sc.prefill_nodes, seed, extra)
    if "static-best" in planners:
        for p in range(1, sc.nodes):
            tasks[f"static:{p}"] = (sc, "static", profile, p, seed, extra)
    return tasks


def _ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """Evolving against the others (throughput, and mean E2E the other way
    round), its flaps, and fixed-4p5d's idle-time reduction."""
    ratios: dict[str, float | None] = {}
    if "evolving" in results:
        ev, ev_e2e = results["evolving"]["throughput_rps"], results["evolving"]["mean_e2e_s"]
        for other, key in (("static_best", "static_best"), ("dynamo", "dynamo")):
            if other in results:
                ratios[f"vs_{key}"] = _ratio(ev, results[other]["throughput_rps"])
                ratios[f"e2e_vs_{key}"] = _ratio(results[other]["mean_e2e_s"], ev_e2e)
        if "oracle" in results:
            ratios["vs_oracle"] = _ratio(ev, results["oracle"]["throughput_rps"])
        ratios["flaps"] = results["evolving"]["flaps"]
    if "async" in results and "layerwise" in results:
        lw = results["layerwise"]["prefill_idle_fraction"]
        ratios["idle_fraction_reduction"] = round(1 - results["async"]["prefill_idle_fraction"] / lw, 4) if lw else None
    if "oracle" in results and "static_best" in results:
        ratios["oracle_vs_static_best"] = _ratio(
            results["oracle"]["throughput_rps"], results["static_best"]["throughput_rps"]
        )
    return ratios


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
    tasks = _tasks(sc, planners, seed=seed, profile=profile, extra=extra)
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
    ratios = _ratios(results)
    return {
        "scenario": sc.name,
        "note": sc.note,
        "nodes": n,
        "gpus": n * gpu.gpus_per_node,
        "profile": gpu.name,
        "requests": len(sc.workload.requests),
        "horizon_s": sc.workload.duration_s,
        "initial_split": [sc.prefill_nodes, n - sc.prefill_nodes],
        "trace_notes": list(sc.workload.notes),
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


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="evolving-infra simulate", description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=SCENARIOS, help="default: trace when --trace is given")
    ap.add_argument("--suite", action="store_true", help="every trace at three loads + the synthetic scenarios")
    ap.add_argument("--trace", help="trace file or folder (--scenario trace, fixed-4p5d)")
    ap.add_argument("--planner", choices=["evolving", "static-best", "dynamo", "all"], help="default: all")
    ap.add_argument("--oracle", action="store_true", help="also search the clairvoyant split table (costly)")
    ap.add_argument("--oracle-segments", type=int, default=3, help="segments of the oracle's split table")
    ap.add_argument("--nodes", type=int, help="nodes (each gpus_per_node GPUs of the profile)")
    ap.add_argument("--initial-prefill", type=int, help="prefill nodes the adaptive planners start from")
    ap.add_argument("--duration", type=float, help="seconds: the horizon (a trace is cut there)")
    ap.add_argument("--load", type=float, help="multiply the agents / the rate / a trace's sessions")
    ap.add_argument("--spread", type=float, help="seconds over which a trace's replicated sessions start")
    ap.add_argument("--mix", choices=["coding", "cu", "math"], help="fixed-4p5d: the agents' kind (default coding)")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE), help="GPU profile JSON")
    ap.add_argument(
        "--directory",
        choices=["memory", "local"],
        help="memory: kvpool's in-memory directory (default for a scenario); local: the simulator's "
        "index, same semantics, ~4x faster (default for --suite)",
    )
    ap.add_argument("--flap-window", type=float, default=600.0, help="s: a split reversal within this is a flap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="parallel simulations")
    ap.add_argument("--suite-traces", default=str(TRACES), help="--suite: the traces folder")
    ap.add_argument("--suite-window", type=float, default=1_800.0, help="--suite: seconds of each trace case")
    ap.add_argument("--suite-max-requests", type=int, default=90_000, help="--suite: requests per simulation, at most")
    ap.add_argument("--no-synthetic", action="store_true", help="--suite: trace cases only")
    ap.add_argument(
        "--suite-units", default="", help="--suite: only trace units whose name starts with one of these (comma list)"
    )
    ap.add_argument(
        "--suite-cache", help="--suite: keep each simulation's result in this folder and reuse it (sim.result_cache)"
    )
    ap.add_argument(
        "--perturb",
        default=",".join(PERTURBATIONS),
        help="--suite: perturbations every trace case also runs under (comma list, or none); sim.perturb",
    )
    ap.add_argument(
        "--perturb-levels", default="light,near,overload", help="--suite: the levels whose cases run perturbed"
    )
    ap.add_argument("--json", action="store_true", help="print the JSON report")
    ap.add_argument("--full", action="store_true", help="keep per-window series in the JSON")
    ap.add_argument("--plot", help="write split-over-time and throughput PNG here")
    return ap


def _suite(ap: argparse.ArgumentParser, a: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    given = {"--scenario": a.scenario, "--trace": a.trace, "--load": a.load, "--duration": a.duration}
    given |= {"--spread": a.spread, "--planner": a.planner, "--mix": a.mix, "--initial-prefill": a.initial_prefill}
    given |= {"--plot": a.plot, "--oracle": a.oracle or None}
    for flag, value in given.items():
        if value is not None:
            ap.error(f"--suite sets {flag} per case; leave it out")
    if not Path(a.suite_traces).is_dir():
        ap.error(f"--suite-traces {a.suite_traces}: no such folder")
    nodes = a.nodes or 9
    try:
        cfg = SuiteConfig(
            nodes=nodes,
            starts=(max(1, nodes // 3), nodes - max(1, nodes // 3)),
            window_s=a.suite_window,
            max_requests=a.suite_max_requests,
            seed=a.seed,
            synthetic=() if a.no_synthetic else SuiteConfig().synthetic,
            traces_root=Path(a.suite_traces),
            perturbations=() if a.perturb == "none" else tuple(x for x in a.perturb.split(",") if x),
            perturb_levels=tuple(x for x in a.perturb_levels.split(",") if x),
            units=tuple(x for x in a.suite_units.split(",") if x),
            cache=Path(a.suite_cache) if a.suite_cache else None,
        )
        return run_suite(cfg, profile=a.profile, jobs=a.jobs, extra=extra)
    except ValueError as e:
        ap.error(str(e))


def interruptible() -> None:
    """Let Ctrl-C (SIGINT) stop the command even when it was started in the
    background of a shell script, which starts it with SIGINT ignored: a
    suite of hundreds of simulations then ran to its end, pool and all,
    whatever was sent to it. The pool's workers inherit the handler."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    interruptible()
    ap = _parser()
    a = ap.parse_args(argv)
    if a.jobs < 1 or a.oracle_segments < 1 or a.flap_window < 0:
        ap.error("--jobs and --oracle-segments must be >= 1, --flap-window >= 0")
    directory = a.directory or ("local" if a.suite else "memory")
    extra: dict[str, Any] = {"directory": directory, "flap_window_s": a.flap_window}
    if a.suite:
        report = _suite(ap, a, extra)
        print(json.dumps(report, indent=1) if a.json else _suite_text(report))
        return 0
    scenario = a.scenario or ("trace" if a.trace else None)
    if scenario is None:
        ap.error("give --scenario, --trace or --suite")
    if scenario == "fixed-4p5d" and (a.planner is not None or a.oracle):
        ap.error("--scenario fixed-4p5d compares KV loading on a static 4P5D: --planner and --oracle do not apply")
    planners = ["evolving", "static-best", "dynamo"] if a.planner in (None, "all") else [a.planner]
    planners += ["oracle"] if a.oracle else []
    t0 = time.perf_counter()
    try:
        sc = build(
            scenario,
            seed=a.seed,
            nodes=a.nodes,
            trace=a.trace,
            duration_s=a.duration,
            scale=a.load,
            mix=a.mix,
            spread_s=a.spread,
            initial_prefill=a.initial_prefill,
        )
    except ValueError as e:  # TraceError included: file and line, nothing simulated
        ap.error(str(e))
    report = simulate(
        sc, planners, seed=a.seed, profile=a.profile, jobs=a.jobs, extra=extra, oracle_segments=a.oracle_segments
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
                f"{name:12s} thr={r['throughput_rps']:.3f} rps  goodput={r['goodput_rps']:.3f}  "
                f"done={r['completed']}/{r['arrived']}  e2e={r['mean_e2e_s']:.1f}s (all {r['mean_e2e_all_s']:.1f}s)  "
                f"p95ttft={r['p95_ttft_s']:.2f}s  switches={r['switches']}  flaps={r['flaps']}"
            )
        print("ratios", report["ratios"])
    return 0


def _suite_text(report: dict[str, Any]) -> str:
    lines = [
        f"{c['case']:60s} vs static {c['vs_static_best']}  vs dynamo {c['vs_dynamo']}  "
        f"switches {c['evolving']['switches']}  flaps {c['evolving']['flaps']}"
        for c in report["cases"]
    ]
    lines.append(
        f"min vs static best {report['min_vs_static_best']}, min vs dynamo {report['min_vs_dynamo']}, "
        f"flaps {report['flaps']}, {report['simulations']} simulations in {report['wall_s']} s"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
