"""The suite's result cache: keys follow the run and the code it depends on."""

from __future__ import annotations

from pathlib import Path

from sim import result_cache
from sim.profiles import DEFAULT_PROFILE


def test_keys_differ_by_run_and_planner_and_repeat_for_the_same_run() -> None:
    prof = str(DEFAULT_PROFILE)
    a = result_cache.task_key("case A, 3P", "static", prof)
    assert a == result_cache.task_key("case A, 3P", "static", prof)
    assert (
        len(
            {
                a,
                result_cache.task_key("case B, 3P", "static", prof),
                result_cache.task_key("case A, 3P", "evolving", prof),
            }
        )
        == 3
    )


def test_the_evolving_planner_depends_on_more_code_than_the_others() -> None:
    assert result_cache.code_fingerprint(True) != result_cache.code_fingerprint(False)


def test_store_then_load_round_trips_and_a_missing_key_is_none(tmp_path: Path) -> None:
    assert result_cache.load(tmp_path, "k") is None
    result_cache.store(tmp_path / "c", "k", {"served": 3, "split_over_time": [[0.0, 1, 2, 0]]})
    assert result_cache.load(tmp_path / "c", "k") == {"served": 3, "split_over_time": [[0.0, 1, 2, 0]]}
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["k.json"]
