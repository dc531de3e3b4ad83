"""The OpenTelemetry SDK objects of one process: a tracer provider exporting
OTLP over HTTP in batches, built from `core.tracing.TraceSettings`.

The provider is this process's own object, never the global one: vLLM (in a
worker) and a test's second app in the same process each keep theirs.
"""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from core.tracing import TraceSettings

# Spans a process holds while the collector is slow or gone; past this they
# are dropped (counted by the SDK), never queued without bound.
MAX_QUEUE = 8192
EXPORT_BATCH = 1024
# Spans leave at most this often: fewer, bigger exports cost less CPU per span.
SCHEDULE_DELAY_MS = 1000


def sampler_of(settings: TraceSettings) -> Sampler:
    ratio = TraceIdRatioBased(settings.sample_ratio)
    return ParentBased(ratio) if settings.parent_based else ratio


def build_provider(settings: TraceSettings, *, service_name: str, attributes: dict[str, str]) -> TracerProvider:
    """A provider whose spans go to `settings.endpoint` (which must be set)."""
    assert settings.endpoint is not None, "build_provider needs an endpoint"
    resource = Resource.create({"service.name": settings.service_name or service_name, **attributes})
    provider = TracerProvider(resource=resource, sampler=sampler_of(settings))
    exporter = OTLPSpanExporter(endpoint=settings.endpoint, timeout=10)
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=MAX_QUEUE,
            max_export_batch_size=EXPORT_BATCH,
            schedule_delay_millis=SCHEDULE_DELAY_MS,
        )
    )
    return provider
