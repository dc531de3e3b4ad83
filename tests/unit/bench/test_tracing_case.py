"""bench._tracing: the overhead figure from paired runs (literal rows)."""

from __future__ import annotations

import statistics

import httpx

from bench._tracing import (
    LEVEL,
    OFF,
    ON,
    PAIRS_PER_ROUND,
    WARM_S,
    overhead,
    receiver_argv,
    run_pair,
    run_pairs,
    traced_env,
    warm_up,
)
from gateway.telemetry._encode import encode_span, resource_head, scope_head, wrap_spans
from gateway.telemetry._lean import LeanSpan
from testing.otlp_receiver import OTLPReceiver


def row(cpu: float | None) -> dict:
    return {"cpu_us_per_request": {"proxy": cpu, "upstream": 10.0}}


def test_overhead_is_the_median_of_the_paired_ratios() -> None:
    pairs = [(row(500.0), row(550.0)), (row(600.0), row(720.0)), (row(400.0), row(420.0))]
    assert overhead(pairs) == 1.1  # ratios 1.10, 1.20, 1.05


def test_a_pair_without_a_figure_is_left_out() -> None:
    assert overhead([(row(None), row(550.0)), (row(500.0), row(600.0))]) == 1.2
    assert overhead([]) is None


def test_the_traced_gateway_samples_every_request() -> None:
    env = traced_env("http://127.0.0.1:4318")
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318" and env["OTEL_TRACES_SAMPLER_ARG"] == "1.0"


def test_both_gateways_warm_up_alike_and_rounds_alternate_which_runs_first() -> None:
    calls: list[tuple[str, int, float]] = []

    def run(name: str, concurrency: int, duration_s: float) -> dict:
        calls.append((name, concurrency, duration_s))
        return row(100.0 if name == OFF else 105.0)

    warm_up(run)
    assert calls == [(OFF, LEVEL, WARM_S), (ON, LEVEL, WARM_S)]
    calls.clear()
    pairs = [run_pair(run, rnd, 5.0) for rnd in range(3)]
    assert [c[0] for c in calls] == [OFF, ON, ON, OFF, OFF, ON]
    assert all(c[1:] == (LEVEL, 5.0) for c in calls)
    assert [(off["order"], on["order"]) for off, on in pairs] == [(0, 1), (1, 0), (0, 1)]
    assert overhead(pairs) == 1.05  # each pair is (untraced, traced) whatever ran first


def test_a_round_runs_several_pairs_and_the_order_alternates_across_rounds() -> None:
    calls: list[str] = []

    def run(name: str, concurrency: int, duration_s: float) -> dict:
        calls.append(name)
        return row(100.0 if name == OFF else 100.0 + len(calls))  # each traced run a little dearer

    pairs = run_pairs(run, 0, 5.0) + run_pairs(run, 1, 5.0)
    assert len(pairs) == 2 * PAIRS_PER_ROUND
    firsts = calls[::2]  # who ran first in each pair: off, on, off, ... through both rounds
    assert firsts == [OFF if i % 2 == 0 else ON for i in range(len(pairs))]
    ratios = [on["cpu_us_per_request"]["proxy"] / off["cpu_us_per_request"]["proxy"] for off, on in pairs]
    assert overhead(pairs) == round(statistics.median(ratios), 3)


def test_the_receiver_runs_niced_and_decodes_after_the_runs() -> None:
    argv = receiver_argv(4318)
    assert argv[:3] == ["nice", "-n", "19"]
    assert argv[-3:] == ["--port", "4318", "--defer-decode"]


def test_a_deferred_receiver_keeps_bodies_and_decodes_them_when_read() -> None:
    span = LeanSpan(None, "decode", 0xABC, 0, 1, {"evolving.node": "w1"}, 1_000)
    span.end(2_000)
    body = wrap_spans(resource_head({"service.name": "gw"}), scope_head("t"), [encode_span(span)] * 3)
    with OTLPReceiver(defer=True) as rx:
        for payload in (body, body, b"\xff not protobuf"):
            assert httpx.post(rx.url + "/v1/traces", content=payload).status_code == 200
        assert rx.requests == 0  # nothing decoded while the runs are timed
        stats = httpx.get(rx.url + "/stats").json()
    assert stats["by_name"] == {"decode": 6} and stats["by_service"] == {"gw": 6}
    assert (stats["requests"], stats["bad_requests"], stats["traces"]) == (2, 1, 1)
