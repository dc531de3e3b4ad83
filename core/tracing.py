"""Trace settings from the standard OpenTelemetry environment names.

Pure: `TraceSettings.from_otel_env(environ)` reads a mapping it is given
(the top-level settings of each process pass `os.environ`); nothing here
reads the environment itself or touches the network. The gateway and the
workers build their tracer providers from the object (gateway/telemetry,
workers/telemetry).

What is read, as every OpenTelemetry SDK reads it:

    OTEL_SDK_DISABLED=true                 tracing off, whatever else is set
    OTEL_TRACES_EXPORTER                   otlp (default) | none (off)
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT     the traces URL, used as is
    OTEL_EXPORTER_OTLP_ENDPOINT            the collector's base URL: /v1/traces is appended
    OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL   http/protobuf only (grpc is refused with the reason)
    OTEL_TRACES_SAMPLER                    parentbased_traceidratio (default), traceidratio,
                                           parentbased_always_on, always_on, parentbased_always_off,
                                           always_off
    OTEL_TRACES_SAMPLER_ARG                the ratio in [0, 1] for the *traceidratio samplers (1.0)
    OTEL_SERVICE_NAME                      service.name of the spans (default: the process's own)

Tracing is off unless an endpoint is named: no provider, no span, no cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SAMPLERS = (
    "parentbased_traceidratio",
    "traceidratio",
    "parentbased_always_on",
    "always_on",
    "parentbased_always_off",
    "always_off",
)
_TRUE = ("true", "1", "yes")


@dataclass(frozen=True)
class TraceSettings:
    """Where spans go and which requests are traced.

    endpoint       OTLP over HTTP traces URL (e.g. http://collector:4318/v1/traces); None: off
    sample_ratio   share of new traces kept, in [0, 1]
    parent_based   honour the caller's sampled flag (an incoming `traceparent`) when one comes
    service_name   service.name resource attribute; "" lets each process name itself
    """

    endpoint: str | None = None
    sample_ratio: float = 1.0
    parent_based: bool = True
    service_name: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"trace sample ratio must be in [0, 1], not {self.sample_ratio}")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"OTLP traces endpoint must be an http(s) URL, not {self.endpoint!r}")

    @property
    def enabled(self) -> bool:
        return self.endpoint is not None

    @classmethod
    def from_otel_env(cls, environ: Mapping[str, str]) -> TraceSettings:
        def get(name: str) -> str | None:
            value = environ.get(name, "").strip()
            return value or None

        if (get("OTEL_SDK_DISABLED") or "").lower() in _TRUE:
            return cls()
        exporter = (get("OTEL_TRACES_EXPORTER") or "otlp").lower()
        if exporter == "none":
            return cls()
        if exporter != "otlp":
            raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: only 'otlp' (over HTTP) or 'none' is supported")
        protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
        if protocol != "http/protobuf":
            raise ValueError(f"OTLP protocol {protocol!r} is not supported: traces go over http/protobuf")
        endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if endpoint is None:
            base = get("OTEL_EXPORTER_OTLP_ENDPOINT")
            endpoint = base.rstrip("/") + "/v1/traces" if base else None
        sampler = (get("OTEL_TRACES_SAMPLER") or "parentbased_traceidratio").lower()
        if sampler not in SAMPLERS:
            raise ValueError(f"OTEL_TRACES_SAMPLER={sampler!r}: one of {', '.join(SAMPLERS)}")
        if sampler.endswith("always_on"):
            ratio = 1.0
        elif sampler.endswith("always_off"):
            ratio = 0.0
        else:
            raw = get("OTEL_TRACES_SAMPLER_ARG")
            try:
                ratio = float(raw) if raw is not None else 1.0
            except ValueError:
                raise ValueError(f"OTEL_TRACES_SAMPLER_ARG must be a number in [0, 1], not {raw!r}") from None
        return cls(
            endpoint=endpoint,
            sample_ratio=ratio,
            parent_based=sampler.startswith("parentbased_"),
            service_name=get("OTEL_SERVICE_NAME") or "",
        )
