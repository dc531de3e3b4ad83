"""Finished spans to the bytes of an OTLP `ExportTraceServiceRequest`, written
directly in the protobuf wire format.

Why not the SDK's encoder (`opentelemetry.exporter.otlp.proto.common`): it
builds one generated message object per span, attribute and value before
serialising; on the gateway's request path that was the larger part of what
tracing cost (~2/3 of the CPU of a traced request's spans here,
docs/benchmarks-history.md). Writing the bytes costs a fraction of it. The output is
checked against the SDK's encoder, decoded with the OpenTelemetry proto
package (tests/unit/gateway/telemetry/test_encode.py).

Field numbers are those of opentelemetry/proto/trace/v1/trace.proto,
common/v1/common.proto and collector/trace/v1/trace_service.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

# Encoded KeyValue messages by (key, value): most attributes repeat (model, node, phase,
# tenant, operation), so most are a dict hit. Bounded; past the bound values are encoded each time.
_KV: dict[tuple[str, Any], bytes] = {}
_MAX_KV = 65536
_SMALL = tuple(bytes((i,)) for i in range(128))


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int) -> bytes:
    """The tag of a length-delimited field (wire type 2)."""
    return _varint(field << 3 | 2)


def _len(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + payload


T1, T2, T3, T4, T5, T7, T9, T11, T13, T15 = (_tag(f) for f in (1, 2, 3, 4, 5, 7, 9, 11, 13, 15))


def _str(tag: bytes, value: str) -> bytes:
    return _len(tag, value.encode())


def _fixed64(field: int, value: int) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<Q", value)


def _any_value(value: Any) -> bytes:
    if isinstance(value, str):
        return _str(T1, value)
    if isinstance(value, bool):  # before int: bool is an int
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _len(T7, value)
    if isinstance(value, Sequence):
        return _len(T5, b"".join([_len(T1, _any_value(v)) for v in value]))
    return _str(T1, str(value))


def _key_value(key: str, value: Any) -> bytes:
    """A KeyValue message's body (its key and value fields)."""
    try:
        cached = _KV.get((key, value))
    except TypeError:  # an unhashable value (a list): encoded each time
        return _str(T1, key) + _len(T2, _any_value(value))
    if cached is None:
        cached = _str(T1, key) + _len(T2, _any_value(value))
        if len(_KV) < _MAX_KV:
            _KV[(key, value)] = cached
    return cached


def _attributes(tag: bytes, attrs: Mapping[str, Any] | None) -> bytes:
    if not attrs:
        return b""
    return b"".join([_len(tag, _key_value(k, v)) for k, v in attrs.items()])


_KIND = tuple(b"\x30" + _varint(k + 1) for k in range(5))  # OTLP's SpanKind counts from UNSPECIFIED = 0
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # field 16, fixed32: "has is_remote", parent local
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)  # ... and the parent is remote
_LINK_FLAGS = (b"\x35" + struct.pack("<I", 0x100), b"\x35" + struct.pack("<I", 0x300))  # Link.flags, field 6
_NO_STATUS = _len(T15, b"")  # present even when unset, as the SDK's encoder writes it
_T7_FIXED, _T8_FIXED = b"\x39", b"\x41"  # fields 7 and 8, wire type 1 (fixed64)


def _span(span: Any) -> bytes:
    ctx = span.context
    parent = span.parent
    parts = [_len(T1, ctx.trace_id.to_bytes(16, "big")), _len(T2, ctx.span_id.to_bytes(8, "big"))]
    if ctx.trace_state:
        parts.append(_str(T3, ctx.trace_state.to_header()))
    if parent is not None:
        parts.append(_len(T4, parent.span_id.to_bytes(8, "big")))
    parts.append(_str(T5, span.name))
    parts.append(_KIND[span.kind.value])
    parts.append(_T7_FIXED + struct.pack("<Q", span.start_time or 0))
    parts.append(_T8_FIXED + struct.pack("<Q", span.end_time or 0))
    parts.append(_attributes(T9, span.attributes))
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    for event in span.events:
        body = _fixed64(1, event.timestamp) + _str(T2, event.name) + _attributes(T3, event.attributes)
        parts.append(_len(T11, body))
    for link in span.links:
        lc = link.context
        body = _len(T1, lc.trace_id.to_bytes(16, "big")) + _len(T2, lc.span_id.to_bytes(8, "big"))
        parts.append(_len(T13, body + _attributes(T4, link.attributes) + _LINK_FLAGS[bool(lc.is_remote)]))
    status = span.status
    if status is not None and status.status_code.value:
        body = (
            (_str(T2, status.description) if status.description else b"") + b"\x18" + _varint(status.status_code.value)
        )
        parts.append(_len(T15, body))
    else:
        parts.append(_NO_STATUS)
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    return b"".join(parts)


def encode_spans(spans: Sequence[Any]) -> bytes:
    """The serialised `ExportTraceServiceRequest` of `spans` (SDK `ReadableSpan`s),
    grouped by resource and instrumentation scope as the collector expects."""
    groups: dict[int, tuple[Any, dict[tuple[str, str], list[bytes]]]] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        entry = groups.setdefault(id(resource), (resource, {}))
        entry[1].setdefault(key, []).append(_len(T2, _span(span)))
    out = []
    for resource, scopes in groups.values():
        body = _len(T1, _attributes(T1, resource.attributes)) if resource is not None else b""
        for (name, version), encoded in scopes.items():
            scope_msg = _str(T1, name) + (_str(T2, version) if version else b"")
            body += _len(T2, _len(T1, scope_msg) + b"".join(encoded))
        out.append(_len(T1, body))
    return b"".join(out)
