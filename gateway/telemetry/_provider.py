"""The OpenTelemetry SDK objects of one process: a tracer provider exporting
OTLP over HTTP in batches, built from `core.tracing.TraceSettings`.

The provider is this process's own object, never the global one: vLLM (in a
worker) and a test's second app in the same process each keep theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased

from core.tracing import TraceSettings
from gateway.telemetry._encode import encode_spans

log = logging.getLogger(__name__)

# Spans a process holds while the collector is slow or gone; past this they
# are dropped (counted by the SDK), never queued without bound.
MAX_QUEUE = 8192
EXPORT_BATCH = 1024
# Spans leave at most this often: fewer, bigger exports cost less CPU per span.
SCHEDULE_DELAY_MS = 1000


class FastOTLPSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter (its transport: retries, compression, headers,
    timeouts) with the request body written by `_encode.encode_spans` instead of
    the SDK's message objects (the same bytes; a fraction of the CPU). Relies on
    the exporter's `_client` and `_shutdown` (opentelemetry-exporter-otlp-proto-http
    is pinned; tests/integration/test_tracing_* decode what it sends)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            body = encode_spans(spans)
        except (TypeError, ValueError, AttributeError) as exc:  # a span the encoder cannot write: this batch only
            log.error("could not encode %d spans: %s", len(spans), exc)
            return SpanExportResult.FAILURE
        result = self._client.export(body)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE


def sampler_of(settings: TraceSettings) -> Sampler:
    ratio = TraceIdRatioBased(settings.sample_ratio)
    return ParentBased(ratio) if settings.parent_based else ratio


def build_provider(
    settings: TraceSettings, *, service_name: str, attributes: dict[str, str]
) -> tuple[TracerProvider, BatchSpanProcessor]:
    """A provider whose spans go to `settings.endpoint` (which must be set), and its
    batch processor (the request path's lean spans go to it directly, `_lean.py`)."""
    assert settings.endpoint is not None, "build_provider needs an endpoint"
    resource = Resource.create({"service.name": settings.service_name or service_name, **attributes})
    provider = TracerProvider(resource=resource, sampler=sampler_of(settings))
    exporter = FastOTLPSpanExporter(endpoint=settings.endpoint, timeout=10)
    processor = BatchSpanProcessor(
        exporter,
        max_queue_size=MAX_QUEUE,
        max_export_batch_size=EXPORT_BATCH,
        schedule_delay_millis=SCHEDULE_DELAY_MS,
    )
    provider.add_span_processor(processor)
    return provider, processor
