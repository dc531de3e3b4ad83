"""A fake OTLP transport for the gateway's span queue (`gateway.telemetry._export.SpanQueue`):
it decodes each posted body with the OpenTelemetry proto package and keeps it.

    posts = FakeSpanPost()
    queue = SpanQueue(posts, resource={...}, scope="...")
    ...; queue.flush(); posts.names()
"""

from __future__ import annotations

import threading

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class FakeSpanPost:
    """Records each body (decoded) and answers `ok` (False: the collector refused it)."""

    def __init__(self, ok: bool = True) -> None:
        self.bodies: list[ExportTraceServiceRequest] = []
        self.ok = ok
        self.posted = threading.Event()

    def __call__(self, body: bytes) -> bool:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        self.bodies.append(req)
        self.posted.set()
        return self.ok

    def spans(self) -> list[Span]:
        return [s for r in self.bodies for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def names(self) -> list[str]:
        return [s.name for s in self.spans()]
