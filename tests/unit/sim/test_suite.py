"""The trace suite: discovery, duplicate workloads, load placement, and a smoke run of the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim import cli
from sim.profiles import GpuProfile
from sim.suite_cases import SuiteConfig, capacity_rps, discover, plan_trace_cases
from sim.traces import load_any


def _traces(root: Path) -> Path:
    (root / "mc").mkdir(parents=True)
    rows = [
        {
            "timestamp": 500 * i,
            "input_length": 2_000 + 37 * (i % 9),
            "output_length": 30 + i % 7,
            "hash_ids": [0, 1, 100 + i],
        }
        for i in range(60)
    ]
    (root / "mc" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    agents = root / "agents" / "chat"
    agents.mkdir(parents=True)
    turns = [
        {
            "timestamp": 1_700_000_000_000 + 4_000 * i,
            "session_id": f"s{i % 3}",
            "input": "ctx " * (300 + 80 * i),
            "output": "ok " * 40,
        }
        for i in range(12)
    ]
    (agents / "run.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    (agents / "empty.jsonl").write_text("")
    converted = root / "agents" / "converted"
    converted.mkdir()
    wl = load_any(agents)
    lines = [
        {
            "timestamp": r.arrival_s * 1000,
            "session_id": r.session_id,
            "input_length": r.prompt_tokens,
            "output_length": r.output_tokens,
            "hash_ids": list(r.block_hashes),
        }
        for r in wl.requests
    ]
    (converted / "chat.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def test_discover_finds_folders_of_agent_text_and_files_and_skips_empty_ones(tmp_path: Path) -> None:
    root = _traces(tmp_path)
    assert [str(p.relative_to(root)) for p in discover(root)] == [
        "agents/chat",
        "agents/converted/chat.jsonl",
        "mc/a.jsonl",
    ]


def test_the_same_workload_in_two_formats_is_planned_once_and_loads_follow_capacity(tmp_path: Path) -> None:
    root = _traces(tmp_path)
    gpu = GpuProfile.from_json()
    cfg = SuiteConfig(nodes=3, starts=(1, 2), window_s=120.0, max_requests=10**8, traces_root=root, synthetic=())
    cases, same, _ = plan_trace_cases(cfg, gpu)
    assert same == {"agents/converted/chat.jsonl": "agents/chat"}
    mc = [c for c in cases if c.unit == "mc/a.jsonl"]
    assert [c.level for c in mc] == ["light", "near", "overload"] and not any(c.capped for c in mc)
    assert mc[2].load / mc[0].load == pytest.approx(1.6 / 0.3, rel=1e-3)
    assert abs(mc[1].offered_rps - 0.85 * mc[1].capacity_rps) < 1e-6
    small = SuiteConfig(nodes=3, starts=(1, 2), window_s=120.0, max_requests=100, traces_root=root, synthetic=())
    capped = [c for c in plan_trace_cases(small, gpu)[0] if c.unit == "mc/a.jsonl"]
    assert len(capped) < 3 and capped[-1].capped and capped[-1].load * 60 == pytest.approx(100, abs=0.01)


def test_capacity_estimate_scales_with_nodes_and_falls_with_longer_prompts(tmp_path: Path) -> None:
    wl = load_any(_traces(tmp_path) / "mc" / "a.jsonl")
    gpu = GpuProfile.from_json()
    assert abs(capacity_rps(wl, gpu, 18) - 2 * capacity_rps(wl, gpu, 9)) < 1e-9
    from dataclasses import replace

    longer = replace(wl, requests=tuple(replace(r, prompt_tokens=r.prompt_tokens * 10) for r in wl.requests))
    assert capacity_rps(longer, gpu, 9) < capacity_rps(wl, gpu, 9) / 3


def test_suite_smoke_prints_cases_and_minimums(tmp_path: Path, capsys) -> None:
    root = _traces(tmp_path)
    argv = ["--suite", "--suite-traces", str(root), "--suite-window", "120", "--suite-max-requests", "400"]
    assert cli.main([*argv, "--no-synthetic", "--nodes", "3", "--jobs", "1", "--directory", "local", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    every = report["cases"]
    cases = [c for c in every if c["perturbation"] is None]
    assert {c["trace"] for c in cases} == {"agents/chat", "mc/a.jsonl"} and len(cases) % 2 == 0
    assert {tuple(c["start"]) for c in cases} == {(1, 2), (2, 1)}
    assert report["min_vs_static_best"] == min(c["vs_static_best"] for c in cases)
    assert report["min_vs_dynamo"] == min(c["vs_dynamo"] for c in cases)
    assert report["flaps"] == sum(c["evolving"]["flaps"] for c in every)
    # Cross-validation: two units, one per half; every base case also runs perturbed, from the first start.
    assert report["tuning_units"] == ["agents/chat"] and report["holdout_units"] == ["mc/a.jsonl"]
    held = [c["vs_static_best"] for c in cases if c["trace"] == "mc/a.jsonl"]
    assert report["min_vs_static_best_holdout"] == min(held)
    perturbed = [c for c in every if c["perturbation"] is not None]
    assert {c["perturbation"] for c in perturbed} >= {"output_x0.5", "output_x2", "contexts_grow", "overload_3x"}
    assert {tuple(c["start"]) for c in perturbed} == {(1, 2)} and all(c["case"].endswith("]") for c in perturbed)
    assert report["min_vs_static_best_perturbed"] == min(c["vs_static_best"] for c in perturbed)
    # mc/a.jsonl has no sessions: every request continues the first one's prefix chain (turn 1), so contexts
    # grow but no chain reaches a fork, and an open loop without turns has no closed form; both are listed.
    mc = {c["level"] for c in cases if c["trace"] == "mc/a.jsonl"}
    assert sorted(report["perturbations_without_form"]) == sorted(
        f"mc/a.jsonl {level} [{name}]" for level in mc for name in ("fanout", "loop_flip")
    )
    assert {c["perturbation"] for c in perturbed if c["trace"] == "mc/a.jsonl"} >= {"contexts_grow"}
    assert report["reverted_moves"] == sum(c["evolving"]["reverted_moves"] for c in every)
    assert isinstance(report["moves_from_best_start"], int) and report["moves_from_best_start_cases"]
    assert report["same_workload"] == {"agents/converted/chat.jsonl": "agents/chat"} and report["convergence"] == []
    row = cases[0]
    assert set(row["static_served"]) == {"1", "2"} and row["static_best"]["split"][0] in (1, 2)
    assert row["evolving"]["arrived"] >= row["evolving"]["completed"] > 0
    assert 0.5 < row["placebo_vs_static_best"] < 1.5 and "below_target_beyond_placebo" in report
    # By requests finished, against the static split that finished the most (the best by served at most that).
    by_best = row["evolving"]["throughput_rps"] / row["static_best"]["throughput_rps"]
    assert 0 < row["vs_static_best_throughput"] <= round(by_best, 4)


def test_convergence_cases_run_evolving_from_every_start(tmp_path: Path) -> None:
    from sim.profiles import DEFAULT_PROFILE
    from sim.suite import run_suite

    root = _traces(tmp_path)
    cfg = SuiteConfig(
        nodes=4,
        starts=(1, 3),
        window_s=120.0,
        max_requests=300,
        traces_root=root,
        synthetic=(),
        convergence=(("mc/a.jsonl", "light"),),
    )
    report = run_suite(cfg, profile=str(DEFAULT_PROFILE), jobs=1, extra={"directory": "local"})
    (conv,) = report["convergence"]
    assert conv["case"] == "mc/a.jsonl light" and set(conv["settled_s"]) == {"1", "2", "3"}
    assert set(conv["vs_static_best"]) == {"1", "2", "3"} and conv["near_best_splits"]
    assert report["max_settled_s"] == conv["max_settled_s"]


def test_units_filter_runs_only_those_units_and_keeps_the_halves_of_all(tmp_path: Path) -> None:
    root = _traces(tmp_path)
    gpu = GpuProfile.from_json()
    cfg = SuiteConfig(nodes=3, starts=(1, 2), window_s=120.0, traces_root=root, synthetic=(), units=("mc/",))
    cases, same, every = plan_trace_cases(cfg, gpu)
    assert {c.unit for c in cases} == {"mc/a.jsonl"}
    assert every == ["agents/chat", "mc/a.jsonl"] and same == {"agents/converted/chat.jsonl": "agents/chat"}


def test_a_cached_suite_reruns_nothing_and_prints_the_same_report(tmp_path: Path, capsys) -> None:
    root = _traces(tmp_path)
    cache = tmp_path / "cache"
    argv = ["--suite", "--suite-traces", str(root), "--suite-window", "120", "--suite-max-requests", "300"]
    argv += ["--no-synthetic", "--nodes", "3", "--jobs", "1", "--perturb", "none", "--json"]
    argv += ["--suite-units", "mc/", "--suite-cache", str(cache)]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    stored = sorted(cache.glob("*.json"))
    assert len(stored) == first["simulations"] and not list(cache.glob(".*.tmp"))
    assert {c["trace"] for c in first["cases"]} == {"mc/a.jsonl"}
    assert first["tuning_units"] == ["agents/chat"] and first["holdout_units"] == ["mc/a.jsonl"]
    assert cli.main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert sorted(cache.glob("*.json")) == stored
    for key in ("cases", "min_vs_static_best", "min_vs_dynamo", "flaps", "moves_from_best_start"):
        assert again[key] == first[key]
    # Another horizon is another run: nothing of the first is reused.
    assert cli.main([*argv[:4], "100", *argv[5:]]) == 0
    capsys.readouterr()
    assert len(list(cache.glob("*.json"))) == 2 * len(stored)


def test_best_split_breaks_a_tie_in_served_by_the_shorter_mean_response() -> None:
    from sim.suite import best_split

    statics = {
        4: {"served": 22_275, "mean_e2e_all_s": 272.2},
        5: {"served": 26_375, "mean_e2e_all_s": 121.7},
        6: {"served": 26_375, "mean_e2e_all_s": 11.8},
        7: {"served": 26_375, "mean_e2e_all_s": 11.0},
        8: {"served": 23_893, "mean_e2e_all_s": 221.4},
    }
    assert best_split(statics) == 7
    assert best_split({**statics, 5: {"served": 26_376, "mean_e2e_all_s": 121.7}}) == 5


def test_overload_3x_runs_once_per_capacity_its_levels_were_placed_on(tmp_path: Path) -> None:
    from sim.suite import perturbed_specs
    from sim.suite_cases import TraceCase

    cfg = SuiteConfig(traces_root=tmp_path, perturbations=("overload_3x",))
    # Light and near remeasured on 8 req/s, overload on the 10 req/s estimate (rate 1 req/s at load 1).
    cases = [
        TraceCase("u", "light", 2.4, 8.0, 2.4, False, measured=True),
        TraceCase("u", "near", 6.8, 8.0, 6.8, False, measured=True),
        TraceCase("u", "overload", 16.0, 10.0, 16.0, False),
    ]
    forms, without = perturbed_specs(cfg, cases)
    assert [(c.level, c.load) for c in forms] == [("light", 24.0), ("overload", 30.0)] and without == []
    # Every level on the estimate: one workload, one case.
    same = [TraceCase("u", level, u * 10.0, 10.0, u * 10.0, False) for level, u in (("light", 0.3), ("near", 0.85))]
    assert [(c.level, c.load) for c in perturbed_specs(cfg, same)[0]] == [("light", 30.0)]


def test_a_command_started_with_sigint_ignored_takes_it_back() -> None:
    import signal

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell gives a background job
    try:
        cli.interruptible()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        def handler(*_: object) -> None:
            return None

        signal.signal(signal.SIGINT, handler)
        cli.interruptible()  # a handler someone installed is left alone
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, old)
