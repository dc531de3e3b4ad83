"""A test receiver for OTLP over HTTP: what a collector would get, decoded.

    with OTLPReceiver() as rx:                 # 127.0.0.1, a free port, a thread
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url}
        ...
        trace = rx.wait_for_trace(lambda spans: ..., timeout_s=10)

`POST /v1/traces` takes an `ExportTraceServiceRequest` (protobuf, gzip or
not), decodes it with the OpenTelemetry proto package and keeps every span
as a `ReceivedSpan` (ids in hex, attributes as plain Python values, links,
the resource's service.name). `GET /stats` answers the counts as JSON (spans,
traces, spans per name and per service), for a benchmark that runs the
receiver as its own process (`python -m testing.otlp_receiver --port N`).

`defer=True` (`--defer-decode`): a POST only keeps the body's bytes and
answers; the bodies are decoded when `/stats` (or `stats()`) is read. A
benchmark measuring an exporter's CPU reads the stats after its timed runs,
so the receiver's protobuf decoding (~25 µs of CPU per span, a tenth of a
core at 1,000 traced requests/s) competes with nothing it measures: run
inline, it raised the traced gateway's own CPU per request by ~30 % on the
2-core bench machine (docs/benchmarks-history.md, tracing).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_OK = ExportTraceServiceResponse().SerializeToString()
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    name: str
    kind: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    links: tuple[ReceivedLink, ...] = field(default_factory=tuple)


def any_value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(any_value(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


def decode_request(body: bytes) -> list[ReceivedSpan]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out: list[ReceivedSpan] = []
    for rs in req.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in rs.resource.attributes}
        service = str(resource.get("service.name", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        name=s.name,
                        kind=KINDS.get(s.kind, str(s.kind)),
                        service=service,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={kv.key: any_value(kv.value) for kv in s.attributes},
                        status_code=s.status.code,
                        links=tuple(
                            ReceivedLink(
                                link.trace_id.hex(),
                                link.span_id.hex(),
                                {kv.key: any_value(kv.value) for kv in link.attributes},
                            )
                            for link in s.links
                        ),
                    )
                )
    return out


class OTLPReceiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, keep: bool = True, defer: bool = False) -> None:
        self._lock = threading.Lock()
        self._defer = defer
        self._pending: list[bytes] = []  # bodies not decoded yet (defer)
        self._spans: list[ReceivedSpan] = []
        self._keep = keep  # False: count only (a long benchmark)
        self._counts: collections.Counter[str] = collections.Counter()
        self._services: collections.Counter[str] = collections.Counter()
        self._trace_ids: set[str] = set()
        self.requests = 0
        self.bad_requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                if self.headers.get("content-encoding", "") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self._answer(404, b"", "text/plain")
                    return
                if receiver._defer:
                    with receiver._lock:
                        receiver._pending.append(body)
                elif not receiver._decode(body):
                    self._answer(400, b"not an ExportTraceServiceRequest", "text/plain")
                    return
                self._answer(200, _OK, "application/x-protobuf")

            def do_GET(self) -> None:
                if self.path != "/stats":
                    self._answer(404, b"", "text/plain")
                    return
                self._answer(200, json.dumps(receiver.stats()).encode(), "application/json")

            def _answer(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: no line per export
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._host = host
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._server.server_port}"

    def start(self) -> OTLPReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _decode(self, body: bytes) -> bool:
        """Decodes and adds one export's spans; False (counted) for a body that is not OTLP."""
        try:
            spans = decode_request(body)
        except Exception:  # noqa: BLE001 - a body that is not OTLP: answered 400 (or counted, deferred)
            with self._lock:
                self.bad_requests += 1
            return False
        self._add(spans)
        return True

    def _decode_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for body in pending:
            self._decode(body)

    def _add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self.requests += 1
            for s in spans:
                self._counts[s.name] += 1
                self._services[s.service] += 1
                self._trace_ids.add(s.trace_id)
            if self._keep:
                self._spans.extend(spans)

    # -- reading -----------------------------------------------------------------------
    def spans(self) -> list[ReceivedSpan]:
        self._decode_pending()
        with self._lock:
            return list(self._spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans() if s.trace_id == trace_id]

    def stats(self) -> dict[str, Any]:
        self._decode_pending()
        with self._lock:
            return {
                "spans": sum(self._counts.values()),
                "traces": len(self._trace_ids),
                "requests": self.requests,
                "bad_requests": self.bad_requests,
                "by_name": dict(self._counts),
                "by_service": dict(self._services),
            }

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(self, found: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0) -> list[ReceivedSpan]:
        """All spans received, once `found(spans)` holds; TimeoutError (with what came) otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise TimeoutError(f"no matching spans after {timeout_s} s; received {len(spans)}: {names[:40]}")
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testing.otlp_receiver", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--defer-decode", action="store_true", help="keep bodies as bytes; decode them when /stats is read")
    args = p.parse_args(argv)
    rx = OTLPReceiver(args.host, args.port, keep=False, defer=args.defer_decode)
    with contextlib.suppress(KeyboardInterrupt):
        rx._server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
