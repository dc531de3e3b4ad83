"""The gateway's span export: one bounded queue, one thread, one OTLP body per batch.

    queue = SpanQueue(post, resource=..., scope=...)   # post(body) -> bool, blocking (HTTP)
    queue.put_many(spans)    # request path: a request's spans' bytes appended; never blocks
    queue.put(span)          # one span (the control plane's, a late one)
    queue.flush()            # everything queued so far, exported now (tests, shutdown)
    queue.shutdown()

`put_many` writes the ended spans' protobuf bytes at once, as one piece
(`_encode.span_fields`), and keeps only those: a span object held until
the next export would live through the collector's young generations into
the old one, and its encoding in the export thread would hold the GIL
against the event loop for tens of milliseconds a batch (measured in
docs/benchmarks-history.md, tracing). The thread sleeps `delay_s` between
exports and is woken early only when a full batch is waiting (once per
`batch` spans, never per span); each wake joins what was queued when it
woke into request bodies of `batch` spans (`_encode.wrap_spans`; one more
request's spans at most, as a piece is not split) and posts each. Spans
that arrive while it posts wait for the next wake unless a full batch of
them is waiting: draining until the queue was empty turned a slow
collector into a stream of small posts (tens a second, each with the HTTP
client's fixed cost: ~30 µs of CPU a traced request). Past `max_queue`
held spans (the collector slow or gone) new spans are dropped and counted
(`dropped`), never queued without bound. `SpanQueueProcessor` puts the SDK
tracer's spans (the control plane's) in the same queue.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from gateway.telemetry._encode import resource_head, scope_head, span_fields, wrap_spans
from gateway.telemetry._lean import LeanSpan

log = logging.getLogger(__name__)

MAX_QUEUE = 16384  # spans held while the collector is slow or gone (~400 bytes each)
EXPORT_BATCH = 4096  # spans per OTLP request at most: a post costs ~1 ms of CPU whatever its size
DELAY_S = 1.0  # spans leave at most this often unless a full batch waits: fewer, bigger exports


class SpanQueue:
    def __init__(
        self,
        post: Callable[[bytes], bool],
        *,
        resource: Mapping[str, Any],
        scope: str,
        max_queue: int = MAX_QUEUE,
        batch: int = EXPORT_BATCH,
        delay_s: float = DELAY_S,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        assert 0 < batch <= max_queue, "a batch fits in the queue"
        self._post = post
        self._resource = resource_head(resource)
        self._scope = scope_head(scope)
        self._max = max_queue
        self._batch = batch
        self._delay_s = delay_s
        self._on_shutdown = on_shutdown  # the transport's own close, after the last export
        # Encoded Span fields, one piece per `put_many`, and how many spans each piece holds
        # (appended before its piece: the export thread pops a piece, then its count).
        self._spans: collections.deque[bytes] = collections.deque()
        self._counts: collections.deque[int] = collections.deque()
        # Spans ever queued and ever taken out: each written by one side only (the
        # event loop; the exporter, under its lock), so neither update is lost.
        self._in = 0
        self._out = 0
        self._wake = threading.Event()
        self._export_lock = threading.Lock()  # the thread and a flush never interleave their batches
        self._stopped = False
        self.dropped = 0
        self._dropped_logged = 0
        self.unencodable = 0
        self.failed_exports = 0
        self._thread = threading.Thread(target=self._run, name="evolving-span-export", daemon=True)
        self._thread.start()

    def put(self, span: LeanSpan) -> None:
        """Queues one ended span (`put_many` of one)."""
        self.put_many([span])

    def put_many(self, spans: list[LeanSpan]) -> None:
        """Queues ended spans' bytes (called on the event loop: no lock, no
        wake but one per batch; a span the encoder cannot write is counted and
        dropped, never raised into the request)."""
        n = len(spans)
        held = self._in - self._out
        if held + n > self._max or self._stopped:
            self.dropped += n
            return
        data, failed = span_fields(spans)
        if failed:
            self.unencodable += len(failed)
            if self.unencodable == len(failed):
                span, exc = failed[0]
                log.error("span %r could not be encoded (%s); such spans are dropped", span.name, exc)
            n -= len(failed)
            if not n:
                return
        self._in += n
        self._counts.append(n)
        self._spans.append(data)
        if held < self._batch <= held + n:
            self._wake.set()

    def __len__(self) -> int:
        """Spans held."""
        return self._in - self._out

    def flush(self) -> bool:
        """Exports every span queued so far; True when every post succeeded."""
        return self._export_all()

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        self._thread.join(10.0)
        self._export_all()
        if self._on_shutdown is not None:
            self._on_shutdown()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            # What is queued now, then full batches only: what comes while it posts waits.
            self._export_all(len(self))
            while len(self) >= self._batch and not self._stopped:
                self._export_all(self._batch)

    def _export_all(self, count: int | None = None) -> bool:
        """Posts the `count` oldest spans (None: every span, until the queue is
        empty), in bodies of `batch` spans: whole pieces, so a body or the last
        one may hold a piece's spans more."""
        ok = True
        with self._export_lock:
            spans, counts = self._spans, self._counts
            while spans and (count is None or count > 0):
                take = self._batch if count is None else min(self._batch, count)
                pieces, taken = [], 0
                while spans and taken < take:
                    pieces.append(spans.popleft())
                    taken += counts.popleft()
                self._out += taken
                if count is not None:
                    count -= taken
                body = wrap_spans(self._resource, self._scope, pieces)
                try:
                    sent = self._post(body)
                except Exception:  # the transport failing must not end the thread: logged, counted
                    log.exception("span export failed")
                    sent = False
                if not sent:
                    self.failed_exports += 1
                    ok = False
        if self.dropped != self._dropped_logged:
            log.warning("span queue full: %d spans dropped so far", self.dropped)
            self._dropped_logged = self.dropped
        return ok


class SpanQueueProcessor(SpanProcessor):
    """The SDK tracer's spans (the control plane's few) into a `SpanQueue`."""

    def __init__(self, queue: SpanQueue) -> None:
        self.queue = queue

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.queue.put(LeanSpan.from_readable(span))

    def shutdown(self) -> None:
        self.queue.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.queue.flush()
