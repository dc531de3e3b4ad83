"""Pure parts of the console: policy validation, the cluster picture, charts,
settings and the `console` command line."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from admin_ui import charts, tiles
from admin_ui.cli import APP_PATH, console_command
from admin_ui.forms import parse_models, validate_policy
from admin_ui.session import ConsoleSettings
from admin_ui.widgets import fmt_age, fmt_bytes, fmt_time, leadership_line, prediction_status

UNLIMITED = {
    "requests_per_minute": None,
    "tokens_per_minute": None,
    "max_concurrent": None,
    "max_active_branches": None,
    "kv_retention_blocks": None,
}


def test_valid_policy_passes_through() -> None:
    policy, problems = validate_policy(
        {
            **UNLIMITED,
            "requests_per_minute": 60,
            "kv_retention_blocks": 0,
            "priority": 0,
            "allowed_models": " a, b ,",
            "cache_isolation": False,
        }
    )
    assert problems == {}
    assert policy == {
        **UNLIMITED,
        "requests_per_minute": 60,
        "kv_retention_blocks": 0,
        "priority": 0,
        "allowed_models": ["a", "b"],
        "cache_isolation": False,
    }


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("requests_per_minute", 0, "at least 1"),
        ("max_concurrent", -2, "at least 1"),
        ("kv_retention_blocks", -1, "at least 0"),
        ("tokens_per_minute", 2.5, "whole number"),
        ("priority", 4, "0 (highest) to 3"),
        ("allowed_models", "a, a", "twice"),
    ],
)
def test_invalid_policy_names_the_field(field: str, value: object, problem: str) -> None:
    _, problems = validate_policy({**UNLIMITED, "priority": 1, field: value})
    assert list(problems) == [field] and problem in problems[field]


def test_parse_models_blank_means_all() -> None:
    assert parse_models("  ,\n ") is None
    assert parse_models("x\ny") == ["x", "y"]


NODE = {
    "node_id": "n<1>",
    "phase": "decode",
    "draining_to": "prefill",
    "healthy": True,
    "pinned_phase": "decode",
    "queue": 4,
    "running": 2,
    "kv_usage": 0.95,
    "tokens_per_s": 12.34,
}


def test_tile_marks_draining_pin_and_escapes() -> None:
    html = tiles.node_tile(NODE)
    assert 'data-node="n&lt;1&gt;"' in html and 'data-draining="yes"' in html
    assert "dashed" in html and "draining → prefill" in html and "📌 decode" in html
    assert "KV 95%" in html and tiles.UNHEALTHY_COLOUR in html  # KV nearly full shows red
    assert "12.3 tok/s" in html


def test_unhealthy_tile_and_picture_order() -> None:
    sick = tiles.node_tile({**NODE, "draining_to": None, "healthy": False})
    assert "unhealthy" in sick and f"4px solid {tiles.UNHEALTHY_COLOUR}" in sick
    picture = tiles.cluster_picture(
        {"split": [1, 1], "nodes": [{"node_id": "b", "phase": "decode"}, {"node_id": "a", "phase": "prefill"}]}
    )
    assert picture.index('data-node="a"') < picture.index('data-node="b"')
    assert "prefill 1" in picture and "decode 1" in picture
    assert "No nodes registered" in tiles.cluster_picture({"nodes": [], "split": [0, 0]})


def test_charts_build_from_api_shapes_and_skip_empty() -> None:
    assert charts.split_history([]) is None and charts.predictions([], 1) is None
    assert charts.timeline([], []) is None and charts.usage([]) is None and charts.top_branches([]) is None
    hist = charts.split_history([{"t": 1.0, "prefill": 1, "decode": 3, "tokens_per_s": 10.0}])
    assert hist is not None and hist.to_dict()["resolve"]["scale"]["y"] == "independent"
    pred = charts.predictions(
        [
            {
                "prefill_nodes": 1,
                "decode_nodes": 1,
                "throughput_rps": 2.0,
                "throughput_lo_rps": 1.0,
                "throughput_hi_rps": 3.0,
                "feasible": False,
            }
        ],
        1,
    )
    assert pred is not None and len(pred.to_dict()["layer"]) == 3
    line = charts.timeline(
        [{"t": 5.0, "node_id": "n", "to_phase": "decode", "outcome": "ok"}],
        [{"t": 6.0, "acted": True, "chosen_split": [1, 1], "reason": "r"}],
    )
    assert line is not None and len(line.to_dict()["vconcat"]) == 2


def _time_encodings(spec: object) -> list[dict]:
    """Every encoding channel of a chart spec whose field is temporal."""
    found: list[dict] = []
    if isinstance(spec, dict):
        if spec.get("type") == "temporal":
            found.append(spec)
        for v in spec.values():
            found += _time_encodings(v)
    elif isinstance(spec, list):
        for v in spec:
            found += _time_encodings(v)
    return found


def test_every_chart_shows_time_in_utc_on_a_24_hour_clock() -> None:
    built = [
        charts.split_history([{"t": 1.0, "prefill": 1, "decode": 3, "tokens_per_s": 10.0}]),
        charts.timeline(
            [{"t": 5.0, "node_id": "n", "to_phase": "decode", "outcome": "ok"}],
            [{"t": 6.0, "acted": True, "chosen_split": [1, 1], "reason": "r"}],
        ),
        charts.usage([{"minute": 60, "prompt_tokens": 5, "cached_tokens": 1, "completion_tokens": 2}]),
    ]
    for chart in built:
        assert chart is not None
        times = _time_encodings(chart.to_dict())
        assert times, chart
        for enc in times:
            fmt = enc.get("format") or enc.get("axis", {}).get("format")
            assert fmt and "%H" in fmt and "%I" not in fmt and "%p" not in fmt, enc  # 24-hour
            utc = enc.get("scale", {}).get("type") == "utc" or str(enc.get("timeUnit", "")).startswith("utc")
            assert utc, enc


def test_prediction_status_says_when_and_why_nothing_newer() -> None:
    assert prediction_status(None, None, 100.0).startswith("The planner has made no prediction yet")
    assert "Its last decision: hold: insufficient data." in prediction_status(
        None, {"t": 99.0, "reason": "hold: insufficient data"}, 100.0
    )
    fresh = prediction_status(1000.0, {"t": 1000.0, "reason": "hold: current split is best"}, 1012.0)
    assert fresh == "Made at 1970-01-01 00:16:40 UTC, 12 s ago."
    idle = prediction_status(1000.0, {"t": 4600.0, "reason": "hold: insufficient data"}, 4601.0)
    assert idle.startswith("Made at 1970-01-01 00:16:40 UTC, 60 min ago.")
    assert idle.endswith("decides without predicting: hold: insufficient data.")
    assert [fmt_age(x) for x in (5, 600, 7200, 3 * 86400)] == ["5 s", "10 min", "2 h", "3 d"]


def test_leadership_line_names_the_leader_and_the_term() -> None:
    assert leadership_line(None) == ""
    lead = {"leader": "g1", "term": 7, "leading": True, "store_reachable": True}
    assert leadership_line(lead) == "This gateway replica (`g1`) leads the planner, term 7."
    follow = leadership_line({**lead, "leading": False})
    assert follow.startswith("Planner leader: replica `g1`, term 7; this replica follows")
    vacant = leadership_line({**lead, "leader": None, "leading": False})
    assert vacant.startswith("No planner leader right now (last term 7)")
    assert "store is unreachable" in leadership_line({**lead, "store_reachable": False})


def test_formatting() -> None:
    assert fmt_time(0) == "1970-01-01 00:00:00" and fmt_time("2024-05-01T10:00:00Z") == "2024-05-01 10:00:00"
    assert fmt_time(None) == "" and fmt_time("garbage") == ""
    assert fmt_bytes(512) == "512 B" and fmt_bytes(3 * 1024**3) == "3.0 GiB"


def test_settings_from_env_and_validation() -> None:
    conf = ConsoleSettings.from_env({"EVOLVING_ADMIN_URL": "http://gw:9000", "EVOLVING_CONSOLE_REFRESH_S": "2"})
    assert (conf.admin_url, conf.refresh_s) == ("http://gw:9000", 2.0)
    assert ConsoleSettings.from_env({}).admin_url == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="EVOLVING_ADMIN_URL"):
        ConsoleSettings(admin_url="gw:9000")
    with pytest.raises(ValueError, match="between 1 and 3600"):
        ConsoleSettings(refresh_s=0.1)


def test_console_command_runs_streamlit_headless_with_admin_url() -> None:
    argv, env = console_command(admin_url="http://gw:8000/", port=8600, environ={"PATH": "/bin"})
    assert argv[:5] == [sys.executable, "-m", "streamlit", "run", str(APP_PATH)]
    assert "--server.headless=true" in argv and "--server.port=8600" in argv
    assert "--client.showErrorDetails=none" in argv
    assert env == {"PATH": "/bin", "EVOLVING_ADMIN_URL": "http://gw:8000"}
    with pytest.raises(ValueError, match="port"):
        console_command(admin_url="http://gw", port=0)
    with pytest.raises(ValueError, match="admin-url"):
        console_command(admin_url="gw", port=8501)


def test_cli_main_rejects_bad_arguments_and_starts_streamlit(monkeypatch: pytest.MonkeyPatch) -> None:
    from admin_ui import cli

    assert cli.main(["--port", "70000"]) == 2
    started: list[tuple[list[str], dict[str, str]]] = []

    class FakePopen:
        def __init__(self, argv: list[str], env: dict[str, str]) -> None:
            started.append((argv, env))

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(cli.subprocess, "Popen", FakePopen)
    assert cli.main(["--admin-url", "http://gw:1234", "--port", "8502"]) == 0
    argv, env = started[0]
    assert "--server.port=8502" in argv and env["EVOLVING_ADMIN_URL"] == "http://gw:1234"


def test_move_check_rows_show_predicted_against_realized() -> None:
    from admin_ui.move_checks import move_check_rows

    checked: dict[str, Any] = {
        "t": 800.0,
        "predicted_gain": 0.212,
        "realized_gain": -0.176,
        "inputs": {
            "verified_move_t": 700.0,
            "verified_from_prefill": 7.0,
            "verified_to_prefill": 6.0,
            "move_delivered": 0.0,
            "move_reverted": 1.0,
        },
    }
    kept = {**checked, "realized_gain": 0.1, "inputs": {**checked["inputs"], "move_reverted": 0.0}}
    fine = {
        **checked,
        "realized_gain": 0.25,
        "inputs": {**checked["inputs"], "move_delivered": 1.0, "verified_latency": 1.0},
    }
    plain: dict[str, Any] = {"t": 5.0, "predicted_gain": None, "realized_gain": None, "inputs": {}}
    rows = move_check_rows([checked, kept, fine, plain])
    assert [r["verdict"] for r in rows] == ["reverted", "short, kept", "delivered"]
    assert rows[0] == {
        "move at": 700.0,
        "move": "7P -> 6P",
        "kind": "throughput",
        "predicted": "+21.2 %",
        "realized": "-17.6 %",
        "verdict": "reverted",
        "checked at": 800.0,
    }
    assert rows[2]["kind"] == "latency"
