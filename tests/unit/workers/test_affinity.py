import os

import pytest

from workers.affinity import http_side_cpus, parse_cpu_list, pin_own_threads


def test_parse_cpu_list_forms():
    assert parse_cpu_list("1") == {1}
    assert parse_cpu_list("0-3") == {0, 1, 2, 3}
    assert parse_cpu_list("0,2,5-6") == {0, 2, 5, 6}
    assert parse_cpu_list("0-1|4-5") == {0, 1, 4, 5}


@pytest.mark.parametrize("bad", ["", "x", "3-1", "-1", ","])
def test_parse_cpu_list_rejects(bad):
    with pytest.raises(ValueError):
        parse_cpu_list(bad)


def test_auto_takes_the_cores_outside_the_engine_bind():
    assert http_side_cpus("auto", "1", {0, 1}) == {0}
    assert http_side_cpus("auto", "0-1", {0, 1, 2, 3}) == {2, 3}


def test_explicit_list_is_kept_within_the_available_cores():
    assert http_side_cpus("2-5", "0-1", {0, 1, 2, 3}) == {2, 3}
    with pytest.raises(ValueError):
        http_side_cpus("x", "0", {0, 1})


@pytest.mark.parametrize("spec,bind", [(None, "1"), ("none", "1"), ("auto", None), ("auto", ""), ("auto", "nobind"),
                                       ("auto", "0-1"), ("auto", "garbage"), ("auto", "all"), ("7", "0")])
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
