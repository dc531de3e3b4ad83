"""core.tracing: the standard OTEL_* names, read as every OpenTelemetry SDK reads them."""

from __future__ import annotations

import pytest

from core.tracing import TraceSettings


@pytest.mark.parametrize(
    ("env", "endpoint", "ratio", "parent_based"),
    [
        ({}, None, 1.0, True),  # nothing named: off
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces", 1.0, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces", 1.0, True),
        # the signal's own endpoint is used as is, and wins over the base URL
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"},
            "http://t:9/x",
            1.0,
            True,
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
            "http://c:4318/v1/traces",
            0.25,
            True,
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.5",
            },
            "http://c:4318/v1/traces",
            0.5,
            False,
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "always_off"},
            "http://c:4318/v1/traces",
            0.0,
            False,
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_TRACES_SAMPLER": "parentbased_always_on",
                "OTEL_TRACES_SAMPLER_ARG": "0.1",
            },
            "http://c:4318/v1/traces",
            1.0,
            True,
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, None, 1.0, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, None, 1.0, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, None, 1.0, True),
    ],
)
def test_from_otel_env(env: dict[str, str], endpoint: str | None, ratio: float, parent_based: bool) -> None:
    s = TraceSettings.from_otel_env(env)
    assert (s.endpoint, s.sample_ratio, s.parent_based, s.enabled) == (
        endpoint,
        ratio,
        parent_based,
        endpoint is not None,
    )


def test_service_name() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SERVICE_NAME": "gw-eu-1"}
    assert TraceSettings.from_otel_env(env).service_name == "gw-eu-1"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, "[0, 1]"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "jaeger_remote"},
            "OTEL_TRACES_SAMPLER",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, "http(s) URL"),
    ],
)
def test_bad_values_fail_at_startup_with_the_reason(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        TraceSettings.from_otel_env(env)
