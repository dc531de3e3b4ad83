"""The worker's spans: each traced generate call, and the KV pulls made for it.

A worker never starts a trace: a call whose `GenerateRequest.traceparent`
is None (the gateway does not trace it, or sampled it out) gets no span.
A traced call gets a SERVER span, child of the gateway's segment span:

    prefill | decode (worker)    node, phase, prompt / cached / generated tokens,
                                 engine queue and first-token times (vLLM's own stats)
      kv_pull                    one per peer the connector read blocks from, as
                                 reported when the pull ended: peer, blocks, bytes, outcome
                                 (news that comes after its call ended still finds the call)

The span's context also goes to vLLM (`trace_headers`), whose own request
span joins the trace when its tracing is on (`EngineConfig.otlp_traces_endpoint`).

Built by the worker's top-level (`workers.cli`) from `core.tracing.TraceSettings`;
off without an endpoint (`WorkerTracing.off()`), then every call returns at once.
The provider is built as the gateway builds its own (gateway/telemetry/_provider.py;
workers may not import the gateway): this process's object, never the global
one, which vLLM's tracing sets for itself.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from core.tracing import TraceSettings
from kvpool.events import PullDone
from workers.protocol import GenerateRequest

MAX_QUEUE = 8192
EXPORT_BATCH = 1024
SCHEDULE_DELAY_MS = 1000
ENDED_KEPT = 1024  # ended call spans a late pull event can still find


class WorkerTracing:
    def __init__(self, provider: Any = None, *, node_id: str = "", block_bytes: Callable[[], int] = lambda: 0) -> None:
        self._provider = provider
        self.tracer = provider.get_tracer("evolving-infra.worker") if provider is not None else None
        self.node_id = node_id
        self.block_bytes = block_bytes  # bytes of one KV block in the host store (0: not known yet)
        self._spans: dict[str, Any] = {}  # request id -> its open span (for the pulls made for it)
        # Request id -> its span once ended, the newest ENDED_KEPT: the engine core reports a pull over
        # a socket, and its news can reach this process after the call it was made for has ended.
        self._ended: collections.OrderedDict[str, Any] = collections.OrderedDict()

    @classmethod
    def off(cls) -> WorkerTracing:
        return cls()

    @classmethod
    def build(cls, settings: TraceSettings, *, node_id: str) -> WorkerTracing:
        if not settings.enabled:
            return cls.off()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        ratio = TraceIdRatioBased(settings.sample_ratio)
        resource = Resource.create(
            {"service.name": settings.service_name or "evolving-infra-worker", "service.instance.id": node_id}
        )
        provider = TracerProvider(resource=resource, sampler=ParentBased(ratio) if settings.parent_based else ratio)
        provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=settings.endpoint, timeout=10),
                max_queue_size=MAX_QUEUE,
                max_export_batch_size=EXPORT_BATCH,
                schedule_delay_millis=SCHEDULE_DELAY_MS,
            )
        )
        return cls(provider, node_id=node_id)

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()

    # -- one generate call ------------------------------------------------------------
    def start(self, req: GenerateRequest) -> Any:
        """The call's span (None: not traced)."""
        if self.tracer is None or not req.traceparent:
            return None
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        parent = extract({"traceparent": req.traceparent})
        kv = req.kv
        span = self.tracer.start_span(
            f"{req.role.value} (worker)",
            parent,
            SpanKind.SERVER,
            {
                "evolving.node": self.node_id,
                "evolving.phase": req.role.value,
                "evolving.segment": req.request_id,
                "gen_ai.operation.name": "chat",
                "gen_ai.request.max_tokens": req.sampling.max_tokens,
                "gen_ai.usage.input_tokens": len(req.prompt_token_ids),
                "evolving.kv.load_blocks": len(kv.load) if kv is not None else 0,
                "evolving.kv.peer_blocks": sum(1 for b in kv.load if b.node_id != self.node_id) if kv else 0,
            },
        )
        if not span.is_recording():
            return None
        self._spans[req.request_id] = span
        return span

    def vllm_headers(self, span: Any) -> dict[str, str] | None:
        """The `traceparent` vLLM's own request span takes as its parent."""
        if span is None:
            return None
        from opentelemetry.propagate import inject
        from opentelemetry.trace import set_span_in_context

        headers: dict[str, str] = {}
        inject(headers, context=set_span_in_context(span))
        return headers

    def end(self, span: Any, request_id: str, *, out: Any, generated: int, finish: str | None) -> None:
        """Close the call's span: tokens, cached tokens, vLLM's queue and first-token times
        (`finish` None: the call ended before the engine finished it, e.g. the gateway closed it)."""
        if span is None:
            return
        self._spans.pop(request_id, None)
        attrs: dict[str, Any] = {"gen_ai.usage.output_tokens": generated}
        if finish:
            attrs["gen_ai.response.finish_reasons"] = (finish,)
        else:
            attrs["evolving.ended_early"] = True
        if out is not None:
            attrs["evolving.cached_tokens"] = int(out.num_cached_tokens or 0)
            metrics = getattr(out, "metrics", None)
            queued, scheduled = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "scheduled_ts", 0.0)
            if queued and scheduled >= queued:
                attrs["evolving.engine.queue_s"] = round(scheduled - queued, 6)  # includes waiting for remote KV
            ttft = getattr(metrics, "first_token_latency", 0.0)
            if ttft:
                attrs["evolving.engine.ttft_s"] = round(float(ttft), 6)
        span.set_attributes(attrs)
        span.end()
        self._ended[request_id] = span
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def pulled(self, event: PullDone) -> None:
        """A KV pull ended: a span under the request it was made for, if that request is traced."""
        span = (self._spans.get(event.rid) or self._ended.get(event.rid)) if event.rid else None
        if span is None or self.tracer is None:
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        end_ns = int((event.ended_at or time.time()) * 1e9)
        start_ns = end_ns - int(event.seconds * 1e9)
        block_bytes = self.block_bytes()
        pull = self.tracer.start_span(
            "kv_pull",
            set_span_in_context(span),
            SpanKind.CLIENT,
            {
                "evolving.kv.peer": event.peer,
                "evolving.kv.blocks": event.block_count,
                "evolving.kv.bytes": event.block_count * block_bytes,
                "evolving.kv.outcome": event.outcome,
                "evolving.node": self.node_id,
            },
            start_time=start_ns,
        )
        if event.outcome != "ok":
            pull.set_status(Status(StatusCode.ERROR, f"pull {event.outcome}: blocks recomputed"))
        pull.end(end_ns)
