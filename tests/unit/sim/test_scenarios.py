"""Every scenario honours --trace/--load/--duration (and the rest) or refuses them with a reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim import cli
from sim.scenarios import build


def _mooncake(tmp_path: Path, rows: int = 40) -> Path:
    p = tmp_path / "mc.jsonl"
    lines = [
        {"timestamp": 1000 * i, "input_length": 1500 + 10 * i, "output_length": 20, "hash_ids": [0, 1 + i, 900 + i]}
        for i in range(rows)
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return p


def test_trace_scenario_honours_load_duration_spread_nodes_and_start(tmp_path: Path) -> None:
    p = str(_mooncake(tmp_path))
    base = build("trace", seed=0, trace=p)
    assert len(base.workload.requests) == 40 and (base.nodes, base.prefill_nodes) == (9, 3)
    sc = build("trace", seed=0, trace=p, scale=3, duration_s=30.0, nodes=4, initial_prefill=1)
    assert (sc.nodes, sc.prefill_nodes, sc.workload.duration_s) == (4, 1, 30.0)
    assert 85 <= len(sc.workload.requests) < 120 and all(r.arrival_s < 30.0 for r in sc.workload.requests)
    wide = build("trace", seed=0, trace=p, scale=2, spread_s=400.0)
    assert wide.workload.duration_s == 400.0 and max(r.arrival_s for r in wide.workload.requests) > 45.0


@pytest.mark.parametrize("name", ["shift", "scale", "burst", "lowrate", "decode-heavy"])
def test_generated_scenarios_refuse_a_trace_and_spread(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=f"--scenario {name} does not take --trace: it builds its own workload"):
        build(name, seed=0, trace=str(_mooncake(tmp_path)))
    with pytest.raises(ValueError, match="does not take --spread"):
        build(name, seed=0, spread_s=100.0)


def test_generated_scenarios_honour_load_and_duration() -> None:
    a, b = build("burst", seed=0, duration_s=300.0), build("burst", seed=0, duration_s=300.0, scale=2)
    assert a.workload.duration_s == 300.0 and len(b.workload.requests) > 1.5 * len(a.workload.requests)
    lo = build("lowrate", seed=0, duration_s=600.0, scale=10)
    assert lo.workload.duration_s == 600.0 and len(lo.workload.requests) > 0


def test_fixed_4p5d_refuses_nodes_and_start_and_mixes_with_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not take --nodes: it compares KV loading on 4P5D"):
        build("fixed-4p5d", seed=0, nodes=12)
    with pytest.raises(ValueError, match="does not take --initial-prefill"):
        build("fixed-4p5d", seed=0, initial_prefill=2)
    p = str(_mooncake(tmp_path))
    with pytest.raises(ValueError, match="does not take --mix"):
        build("fixed-4p5d", seed=0, trace=p, mix="cu")
    sc = build("fixed-4p5d", seed=0, trace=p, scale=2, duration_s=20.0)
    assert (sc.nodes, sc.prefill_nodes, sc.workload.duration_s) == (9, 4, 20.0)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"scale": 0}, "--load must be > 0"),
        ({"duration_s": -5.0}, "--duration must be > 0"),
        ({"nodes": 1}, "--nodes must be >= 2"),
        ({"initial_prefill": 12}, "--initial-prefill 12 exceeds the 9 nodes"),
    ],
)
def test_bad_numbers_are_refused(kw: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        build("burst", seed=0, **kw)
    with pytest.raises(ValueError, match="--scenario trace needs --trace"):
        build("trace", seed=0)


def _exit(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert isinstance(e.value.code, int)
    return e.value.code, capsys.readouterr().err


def test_cli_bad_trace_exits_2_naming_file_and_line_and_simulates_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1, "input_length"\n')
    monkeypatch.setattr(cli, "simulate", lambda *a, **k: pytest.fail("simulated a bad trace"))
    code, err = _exit(["--trace", str(p), "--json"], capsys)
    assert code == 2 and f"{p}:2: not valid JSON" in err
    code, err = _exit(["--trace", str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "no such file or folder" in err
    code, err = _exit(["--scenario", "burst", "--trace", str(p)], capsys)
    assert code == 2 and "does not take --trace" in err
    code, err = _exit(["--scenario", "fixed-4p5d", "--planner", "evolving"], capsys)
    assert code == 2 and "--planner and --oracle do not apply" in err
    code, err = _exit(["--suite", "--load", "2"], capsys)
    assert code == 2 and "--suite sets --load per case" in err


def test_cli_trace_run_reports_completed_goodput_and_e2e_over_all(tmp_path: Path, capsys) -> None:
    p = _mooncake(tmp_path)
    args = ["--trace", str(p), "--load", "2", "--duration", "60", "--nodes", "3", "--directory", "local"]
    assert cli.main([*args, "--planner", "static-best", "--jobs", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    best = report["results"]["static_best"]
    assert report["horizon_s"] == 60.0 and report["trace_notes"][0].startswith("load 2: 2 copies of 40 sessions")
    for key in ("completed", "arrived", "completed_fraction", "goodput_rps", "mean_e2e_all_s", "flaps"):
        assert key in best
    assert best["completed"] <= best["arrived"] and best["mean_e2e_all_s"] >= best["mean_e2e_s"] - 1e-9
