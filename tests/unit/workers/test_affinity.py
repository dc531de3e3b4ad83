import os
import re

import pytest

from workers.affinity import http_side_cpus, parse_cpu_list, pin_own_threads, spawning_on


def test_parse_cpu_list_forms():
    assert parse_cpu_list("1") == {1}
    assert parse_cpu_list("0-3") == {0, 1, 2, 3}
    assert parse_cpu_list("0,2,5-6") == {0, 2, 5, 6}
    assert parse_cpu_list("0-1|4-5") == {0, 1, 4, 5}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "no CPUs in ''"),
        ("x", "bad CPU list 'x'"),
        ("3-1", "bad CPU range '3-1'"),
        ("-1", "bad CPU list '-1'"),
        (",", "no CPUs in ','"),
    ],
)
def test_parse_cpu_list_rejects(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_cpu_list(bad)


def test_auto_takes_the_cores_outside_the_engine_bind():
    assert http_side_cpus("auto", "1", {0, 1}) == {0}
    assert http_side_cpus("auto", "0-1", {0, 1, 2, 3}) == {2, 3}


def test_explicit_list_is_kept_within_the_available_cores():
    assert http_side_cpus("2-5", "0-1", {0, 1, 2, 3}) == {2, 3}
    with pytest.raises(ValueError, match="bad CPU list 'x'"):
        http_side_cpus("x", "0", {0, 1})


@pytest.mark.parametrize(
    ("spec", "bind"),
    [
        (None, "1"),
        ("none", "1"),
        ("auto", None),
        ("auto", ""),
        ("auto", "nobind"),
        ("auto", "0-1"),
        ("auto", "garbage"),
        ("auto", "all"),
        ("7", "0"),
    ],
)
def test_left_alone(spec, bind):
    assert http_side_cpus(spec, bind, {0, 1}) is None


def test_pin_own_threads_moves_this_process_and_back():
    before = os.sched_getaffinity(0)
    one = {min(before)}
    try:
        assert pin_own_threads(one) >= 1
        assert os.sched_getaffinity(0) == one
    finally:
        pin_own_threads(before)
    assert os.sched_getaffinity(0) == before


def test_spawning_on_gives_children_the_mask_and_this_process_its_own_back():
    import subprocess
    import sys

    before = os.sched_getaffinity(0)
    one = {max(before)}
    with spawning_on(one):
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            check=True,
        )
    assert child.stdout.strip() == str(sorted(one))
    assert os.sched_getaffinity(0) == before
    with spawning_on(None):
        assert os.sched_getaffinity(0) == before
    with pytest.raises(ValueError, match=r"CPUs \[\d+\] are outside this process's"), spawning_on({max(before) + 1}):
        pass
    assert os.sched_getaffinity(0) == before
