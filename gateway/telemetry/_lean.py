"""Request-path spans recorded without the SDK's per-span machinery.

The SDK's `Tracer.start_span` builds, per span, locks, bounded and
validated attribute, event and link containers, and runs the processors'
start hooks: ~90 µs of CPU per span on this machine under load, against
~6 µs for the finished `ReadableSpan` that is all an exporter ever reads
(docs/benchmarks-history.md, "bench gateway", tracing). A request makes six to ten
spans, so the request path records `LeanSpan`s: plain slots while open, one
SDK `ReadableSpan` handed to the same batch processor when ended. What stays
the SDK's: the sampler (its decision for each new trace), the resource, the
batch processor and the OTLP exporter. The control plane's few spans use the
SDK's tracer as is.

Attribute values are the serving code's own (str, int, float, bool and
tuples of one of them), so they are not re-validated here.
"""

from __future__ import annotations

import random
import time
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class LeanSink:
    """Where this process's lean spans go: the provider's sampler, resource and batch processor."""

    def __init__(self, processor: SpanProcessor, resource: Resource, sampler: Sampler, scope: str) -> None:
        self.processor = processor
        self.resource = resource
        self.sampler = sampler
        self.scope = InstrumentationScope(scope)

    def root(
        self, name: str, remote: SpanContext | None, kind: SpanKind, attributes: dict[str, Any]
    ) -> LeanSpan | None:
        """A request's own span, child of the client's `remote` context if any;
        None when the sampler drops the trace."""
        parent = set_span_in_context(NonRecordingSpan(remote)) if remote is not None else None
        trace_id = remote.trace_id if remote is not None else random.getrandbits(128) or 1
        result = self.sampler.should_sample(parent, trace_id, name, kind, attributes)
        if result.decision is not Decision.RECORD_AND_SAMPLE:
            return None
        state = result.trace_state if result.trace_state is not None else TraceState()
        return LeanSpan(self, name, trace_id, remote, kind, attributes, state=state)

    def child(
        self, parent: LeanSpan, name: str, kind: SpanKind, attributes: dict[str, Any] | None, start_time: int | None
    ) -> LeanSpan:
        ctx = parent.context
        return LeanSpan(
            self, name, ctx.trace_id, ctx, kind, attributes or {}, start_time=start_time, state=ctx.trace_state
        )


class LeanSpan:
    """An open span: attributes, status and links set as it runs; `end()` hands
    the finished span to the batch processor (once)."""

    __slots__ = ("_sink", "name", "context", "parent", "kind", "attributes", "start_time", "status", "links", "ended")

    def __init__(
        self,
        sink: LeanSink,
        name: str,
        trace_id: int,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        *,
        start_time: int | None = None,
        state: TraceState | None = None,
    ) -> None:
        self._sink = sink
        self.name = name
        self.context = SpanContext(trace_id, random.getrandbits(64) or 1, False, _SAMPLED, state)
        self.parent = parent
        self.kind = kind
        self.attributes = dict(attributes)
        self.start_time = start_time if start_time is not None else time.time_ns()
        self.status = _UNSET
        self.links: list[Link] = []
        self.ended = False

    # -- the parts of opentelemetry.trace.Span the serving code uses -------------------
    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return not self.ended

    def update_name(self, name: str) -> None:
        self.name = name

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Status) -> None:
        self.status = status

    def add_link(self, context: SpanContext, attributes: dict[str, Any] | None = None) -> None:
        self.links.append(Link(context, attributes))

    def record_exception(self, exc: BaseException) -> None:
        self.attributes["exception.type"] = type(exc).__name__
        self.attributes["exception.message"] = str(exc)[:512]

    def end(self, end_time: int | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        sink = self._sink
        finished = ReadableSpan(
            name=self.name,
            context=self.context,
            parent=self.parent,
            resource=sink.resource,
            attributes=self.attributes,
            links=tuple(self.links),
            kind=self.kind,
            status=self.status,
            start_time=self.start_time,
            end_time=end_time if end_time is not None else time.time_ns(),
            instrumentation_scope=sink.scope,
        )
        sink.processor.on_end(finished)
