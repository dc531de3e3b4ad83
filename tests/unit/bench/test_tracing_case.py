"""bench._tracing: the overhead figure from paired runs (literal rows)."""

from __future__ import annotations

from bench._tracing import overhead, traced_env


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
