"""Request-path spans recorded without the SDK's per-span machinery.

The SDK's `Tracer.start_span` builds, per span, locks, bounded and
validated attribute, event and link containers, and runs the processors'
start hooks (~90 µs of CPU per span on this machine under load); even a
finished `ReadableSpan` handed to its batch processor cost ~10 µs a span
(docs/benchmarks-history.md, "bench gateway", tracing). A request makes six
to ten spans, so the request path records `LeanSpan`s: a slots object with
the ids as plain ints, the attributes as the serving code's own dict and
values, made by `new_span` (in C where the optional extension was built);
once ended it goes to the export queue (`_export.SpanQueue`: a request's
spans together, when its turn finishes, `_turn.py`), which keeps only their
OTLP bytes (`_encode.py`) for the export thread to post in batches. No
`SpanContext` is built unless a caller asks for one (a link).

The sampling rule is the one `TraceSettings` names (ratio on the trace id,
the caller's sampled flag first when parent-based), applied inline with the
SDK's own bound (`TraceIdRatioBased.get_bound_for_rate`); the control
plane's few spans use the SDK's tracer and sampler as is.

Attribute values are the serving code's own (str, int, float, bool, tuples
of one of them, or a str -> number mapping, written as sorted "key=value"
strings), so they are not re-validated here; a span takes ownership of the
attribute dict it is given.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from core.tracing import TraceSettings

_configure: Callable[..., None] | None
try:  # the optional C extension (_spanwire.c): spans made and encoded without a Python frame
    from gateway.telemetry._spanwire import configure as _configure
    from gateway.telemetry._spanwire import new_span as _new_span
    from gateway.telemetry._spanwire import traceparent as _traceparent
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _configure = None

    def _traceparent(trace_id: int, span_id: int, /) -> str:
        return f"00-{trace_id:032x}-{span_id:016x}-01"


SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_LOW64 = TraceIdRatioBased.TRACE_ID_LIMIT
_getrandbits = random.getrandbits
_time_ns = time.time_ns
INTERNAL = SpanKind.INTERNAL.value


class LeanSink:
    """Where this process's lean spans go, and which new traces are kept.

    `put` takes an ended span, `put_many` a list of them (a request's, at its
    end): the export queue's; neither may block. Without `put_many` each span
    of a list goes to `put`."""

    __slots__ = ("put", "put_many", "_bound", "_parent_based")

    def __init__(
        self,
        put: Callable[[LeanSpan], None],
        settings: TraceSettings,
        put_many: Callable[[list[LeanSpan]], None] | None = None,
    ) -> None:
        self.put = put
        self.put_many = put_many if put_many is not None else _each(put)
        self._bound = TraceIdRatioBased.get_bound_for_rate(settings.sample_ratio)
        self._parent_based = settings.parent_based

    def sampled(self, trace_id: int, remote: SpanContext | None) -> bool:
        """The SDK samplers' rule (`ParentBased(TraceIdRatioBased(r))` or `TraceIdRatioBased(r)`)."""
        if remote is not None and self._parent_based:
            return remote.trace_flags.sampled
        return trace_id & _LOW64 < self._bound

    def root(self, name: str, remote: SpanContext | None, kind: int, attributes: dict[str, Any]) -> LeanSpan | None:
        """A request's own span, child of the client's `remote` context if any;
        None when the sampler drops the trace. `kind`: a `SpanKind`'s value."""
        if remote is None:
            trace_id = _getrandbits(128) or 1
            if trace_id & _LOW64 >= self._bound:
                return None
            return new_span(self.put, name, trace_id, 0, kind, attributes, None, None)
        if not self.sampled(remote.trace_id, remote):
            return None
        span = new_span(
            self.put, name, remote.trace_id, remote.span_id, kind, attributes, None, remote.trace_state or None
        )
        span.parent_remote = True
        return span

    def child(
        self, parent: LeanSpan, name: str, kind: int, attributes: dict[str, Any] | None, start_time: int | None
    ) -> LeanSpan:
        return new_span(
            self.put,
            name,
            parent.trace_id,
            parent.span_id,
            kind,
            {} if attributes is None else attributes,
            start_time,
            parent.trace_state,
        )


def _each(put: Callable[[LeanSpan], None]) -> Callable[[list[LeanSpan]], None]:
    def put_many(spans: list[LeanSpan]) -> None:
        for span in spans:
            put(span)

    return put_many


class LeanSpan:
    """A span: open while the request runs (attributes, status and links set as
    it goes), then, once ended, the record the exporter encodes.

    Ids are ints (`parent_id` 0: a root); `kind` is `SpanKind`'s value."""

    __slots__ = (
        "_put",
        "name",
        "trace_id",
        "span_id",
        "parent_id",
        "parent_remote",
        "trace_state",
        "kind",
        "attributes",
        "start_time",
        "end_time",
        "status",
        "links",
        "events",
    )

    def __init__(
        self,
        put: Callable[[LeanSpan], None] | None,
        name: str,
        trace_id: int,
        parent_id: int,
        kind: int,
        attributes: dict[str, Any],
        start_time: int | None,
        trace_state: TraceState | None = None,
    ) -> None:
        self._put = put
        self.name = name
        self.trace_id = trace_id
        self.span_id = _getrandbits(64) or 1
        self.parent_id = parent_id
        self.parent_remote = False
        self.trace_state = trace_state
        self.kind = kind
        self.attributes = attributes
        self.start_time = _time_ns() if start_time is None else start_time  # None: now
        self.end_time = 0
        self.status: Status | None = None
        self.links: list[Link] | None = None
        # (time_ns, name, attributes) of each event: only spans converted from the SDK's have any
        self.events: tuple[tuple[int, str, Any], ...] = ()

    @classmethod
    def from_readable(cls, span: ReadableSpan) -> LeanSpan:
        """The record of an SDK span (the control plane's), for the same queue."""
        ctx = span.context
        assert ctx is not None, "an SDK span always has its context"
        parent = span.parent
        lean = cls(
            None,
            span.name,
            ctx.trace_id,
            parent.span_id if parent is not None else 0,
            span.kind.value,
            dict(span.attributes or {}),
            span.start_time or 0,
        )
        lean.span_id = ctx.span_id
        lean.parent_remote = bool(parent is not None and parent.is_remote)
        lean.trace_state = ctx.trace_state or None
        lean.end_time = span.end_time or 0
        lean.status = span.status if span.status.status_code is not StatusCode.UNSET else None
        lean.links = list(span.links) or None
        lean.events = tuple((e.timestamp, e.name, e.attributes) for e in span.events)
        return lean

    # -- the parts of opentelemetry.trace.Span the serving code uses -------------------
    def get_span_context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, False, SAMPLED, self.trace_state)

    def traceparent(self) -> str:
        """The W3C `traceparent` naming this span as the parent (sampled: only sampled spans exist)."""
        return _traceparent(self.trace_id, self.span_id)

    def is_recording(self) -> bool:
        return self.end_time == 0

    def update_name(self, name: str) -> None:
        self.name = name

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Status) -> None:
        self.status = status

    def add_link(self, context: SpanContext, attributes: dict[str, Any] | None = None) -> None:
        if self.links is None:
            self.links = []
        self.links.append(Link(context, attributes))

    def record_exception(self, exc: BaseException) -> None:
        self.attributes["exception.type"] = type(exc).__name__
        self.attributes["exception.message"] = str(exc)[:512]

    def end(self, end_time: int | None = None) -> None:
        """Ends the span (once) and hands it to the export queue (none for a
        turn's child: the turn hands its children over when it finishes)."""
        if self.end_time:
            return
        self.end_time = _time_ns() if end_time is None else end_time
        if self._put is not None:
            self._put(self)


# new_span(put, name, trace_id, parent_id, kind, attributes, start_time | None, trace_state | None):
# an open `LeanSpan`, as its constructor makes one (start_time None: now). The C one fills the
# slots (their offsets found by `configure`) without running `__init__`.
new_span: Callable[..., LeanSpan] = LeanSpan
if _configure is not None:
    _configure(LeanSpan, _getrandbits)
    new_span = _new_span
