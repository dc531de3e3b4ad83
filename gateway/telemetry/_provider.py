"""The OpenTelemetry objects of the gateway process, built from
`core.tracing.TraceSettings`: the export queue (`_export.SpanQueue`) posting
OTLP over HTTP, and a tracer provider for the control plane's spans that
feeds the same queue.

The provider is this process's own object, never the global one: vLLM (in a
worker) and a test's second app in the same process each keep theirs.
"""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from core.tracing import TraceSettings
from gateway.telemetry._export import SpanQueue, SpanQueueProcessor

SCOPE = "evolving-infra.gateway"


class OTLPBodyPoster:
    """Posts an encoded `ExportTraceServiceRequest` with the SDK's OTLP/HTTP
    exporter's transport (its retries, compression, headers, timeouts; the
    body is ours, `_encode.py`). Relies on the exporter's `_client`
    (opentelemetry-exporter-otlp-proto-http is pinned;
    tests/integration/test_tracing_* decode what it sends)."""

    def __init__(self, endpoint: str, timeout_s: float = 10.0) -> None:
        self._exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)

    def __call__(self, body: bytes) -> bool:
        if not body:
            return True
        return bool(self._exporter._client.export(body).success)

    def shutdown(self) -> None:
        self._exporter.shutdown()  # type: ignore[no-untyped-call]  # the SDK's method has no annotations


def sampler_of(settings: TraceSettings) -> Sampler:
    ratio = TraceIdRatioBased(settings.sample_ratio)
    return ParentBased(ratio) if settings.parent_based else ratio


def build_provider(
    settings: TraceSettings, *, service_name: str, attributes: dict[str, str]
) -> tuple[TracerProvider, SpanQueue]:
    """A provider whose spans go to `settings.endpoint` (which must be set), and
    the export queue behind it (the request path's lean spans go to it directly)."""
    assert settings.endpoint is not None, "build_provider needs an endpoint"
    resource = Resource.create({"service.name": settings.service_name or service_name, **attributes})
    poster = OTLPBodyPoster(settings.endpoint)
    queue = SpanQueue(poster, resource=resource.attributes, scope=SCOPE, on_shutdown=poster.shutdown)
    provider = TracerProvider(resource=resource, sampler=sampler_of(settings))
    provider.add_span_processor(SpanQueueProcessor(queue))
    return provider, queue
