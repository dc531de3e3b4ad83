"""Spans to the bytes of an OTLP `ExportTraceServiceRequest`, written directly
in the protobuf wire format: a request's spans when it finishes (`span_fields`),
a batch by one join (in the export thread).

Why not the SDK's encoder (`opentelemetry.exporter.otlp.proto.common`): it
builds one generated message object per span, attribute and value before
serialising, several times the CPU of the spans themselves. Here each
ended `LeanSpan` (`_lean.py`) becomes its finished `Span` field, and a batch
of them one request body by a join: most attribute fields repeat (model,
node, phase, tenant, operation) and are a dict hit on their finished bytes;
the rest are written from a per-key prefix. A span with nothing rare (no
events, links or status; flat attribute values) is written by
`_spanwire.c` instead, the same bytes at a fraction of the CPU, where the
optional extension was built: a request's common spans in one call that
reads them from their slots. The output of both is checked against the
SDK's encoder, decoded with the OpenTelemetry proto package
(tests/unit/gateway/telemetry/test_encode.py).

Field numbers are those of opentelemetry/proto/trace/v1/trace.proto,
common/v1/common.proto and collector/trace/v1/trace_service.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.telemetry._lean import LeanSpan

# The C encoder of the common span (_spanwire.c); None where no compiler built it.
_span_field: Callable[..., bytes | None] | None
_span_fields: Callable[[list[LeanSpan]], tuple[bytes, list[LeanSpan]]] | None
try:
    from gateway.telemetry._spanwire import span_field as _span_field
    from gateway.telemetry._spanwire import span_fields as _span_fields
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _span_field = _span_fields = None

ENCODE_ERRORS = (TypeError, ValueError, AttributeError, OverflowError, struct.error)  # what OTLP cannot carry raises

_SMALL = tuple(bytes((i,)) for i in range(128))
# Finished span attribute fields: key -> value -> (type, bytes). A key with more
# than _MAX_VALUES values (ids, sizes) is no longer stored (_NO_CACHE).
_SPAN_FIELDS: dict[str, dict[Any, tuple[type, bytes]]] = {}
_NO_CACHE: dict[Any, tuple[type, bytes]] = {}  # the values of keys past either bound: never stored
_MAX_KEYS = 1024
_MAX_VALUES = 4096
_KEYS: dict[str, bytes] = {}  # key -> its KeyValue.key field
_HEADS: dict[str, tuple[bytes, ...]] = {}  # span name -> its name and kind fields, by kind
_HEADS_BY_KEY: dict[str, dict[int, bytes]] = {}  # attribute key -> its fields' heads (`_new_field`)
_MAX_HEADS = 256


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


def _int64(n: int) -> bytes:
    """An int64 field's varint; OTLP has no wider integer."""
    if not _MIN64 <= n <= _MAX64:
        raise ValueError(f"{n} does not fit an OTLP int (64 bits)")
    return _varint(n)


_MIN64, _MAX64 = -(1 << 63), (1 << 63) - 1


def _tag(field: int) -> bytes:
    """The tag of a length-delimited field (wire type 2)."""
    return _varint(field << 3 | 2)


def _len(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + payload


T1, T2, T3, T4, T5, T7, T9, T11, T13, T15 = (_tag(f) for f in (1, 2, 3, 4, 5, 7, 9, 11, 13, 15))
_DOUBLE = struct.Struct("<d")
_TIMES = struct.Struct("<BQBQ")  # Span fields 7 and 8 (fixed64): start and end time
# Span fields 1 (trace_id, 16 bytes, as two big-endian halves), 2 (span_id) and 4 (parent_span_id)
_IDS = struct.Struct(">BBQQBBQ")
_IDS_PARENT = struct.Struct(">BBQQBBQBBQ")
_LOW64 = (1 << 64) - 1


def _str(tag: bytes, value: str) -> bytes:
    return _len(tag, value.encode())


def _any_value(value: Any) -> bytes:
    kind = type(value)  # exact types first: the ABC checks below cost ~1 µs each
    if kind is str:
        return _str(T1, value)
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        return b"\x18" + _int64(value)
    if kind is float:
        return b"\x21" + _DOUBLE.pack(value)
    if kind is tuple or kind is list:
        return _len(T5, b"".join([_len(T1, _any_value(v)) for v in value]))
    return _other_value(value)


def _other_value(value: Any) -> bytes:
    """A value of a rarer type (a mapping, a subclass, bytes) or of none OTLP has (its str())."""
    if isinstance(value, Mapping):
        return _any_value(_pairs(value))
    if isinstance(value, str):  # its characters, not its str() (an enum's): as the SDK's encoder
        return _len(T1, str.encode(value))
    if isinstance(value, bool):  # before int: bool is an int
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _int64(int(value))
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _len(T7, value)
    if isinstance(value, Sequence):
        return _len(T5, b"".join([_len(T1, _any_value(v)) for v in value]))
    return _str(T1, str(value))


def _pairs(value: Mapping[str, Any]) -> tuple[str, ...]:
    """A raw mapping attribute (counts by name, _lean.py) as sorted "name=count" strings."""
    return tuple([f"{k}={v}" for k, v in sorted(value.items())])


def _field(tag: bytes, key: str, value: Any) -> bytes:
    """One attribute as a whole field `tag` (a KeyValue message, its tag and length)."""
    return _len(tag, _key(key) + _len(T2, _any_value(value)))


def _key(key: str) -> bytes:
    prefix = _KEYS.get(key)
    if prefix is None:
        prefix = _str(T1, key)
        if len(_KEYS) < _MAX_KEYS:
            _KEYS[key] = prefix
    return prefix


def _attributes(tag: bytes, attrs: Mapping[str, Any] | None) -> bytes:
    if not attrs:
        return b""
    return b"".join([_field(tag, k, v) for k, v in attrs.items()])


_KIND = tuple(b"\x30" + _varint(k + 1) for k in range(5))  # OTLP's SpanKind counts from UNSPECIFIED = 0
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # field 16, fixed32: "has is_remote", parent local
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)  # ... and the parent is remote
_LINK_FLAGS = (b"\x35" + struct.pack("<I", 0x100), b"\x35" + struct.pack("<I", 0x300))  # Link.flags, field 6
_NO_STATUS = _len(T15, b"")  # present even when unset, as the SDK's encoder writes it
_TAIL_LOCAL = _NO_STATUS + _FLAGS_LOCAL  # the common end of a span: no status, local parent
_TAIL_REMOTE = _NO_STATUS + _FLAGS_REMOTE


def _head(name: str) -> tuple[bytes, ...]:
    """A span name's `name` field followed by each `kind` field, by kind value."""
    heads = _HEADS.get(name)
    if heads is None:
        heads = tuple(_str(T5, name) + kind for kind in _KIND)
        if len(_HEADS) < _MAX_KEYS:
            _HEADS[name] = heads
    return heads


def encode_span(span: LeanSpan) -> bytes:
    """One span as a `Span` field of a ScopeSpans message (tag 2, length,
    body), for `wrap_spans`. The fields go in the order that costs least
    (protobuf readers take any order). The C encoder writes the same bytes
    for a span with nothing rare (no events, links or status)."""
    tid = span.trace_id
    if _span_field is not None and not (span.events or span.links or span.status is not None):
        field = _span_field(
            tid >> 64,
            tid & _LOW64,
            span.span_id,
            span.parent_id,
            _head(span.name)[span.kind],
            span.start_time,
            span.end_time,
            _str(T3, span.trace_state.to_header()) if span.trace_state else b"",
            span.attributes,
            _TAIL_REMOTE if span.parent_remote else _TAIL_LOCAL,
        )
        if field is not None:
            return field
    return _python_span(span)


def span_fields(spans: list[LeanSpan]) -> tuple[bytes, list[tuple[LeanSpan, Exception]]]:
    """The `Span` fields of `spans` back to back (for `wrap_spans`, as one
    piece), and the spans no encoder could write, with why (they are left out).
    The C encoder reads the common spans from their slots in one call; the
    rest, and every span where it was not built, go through `encode_span`."""
    if _span_fields is not None:
        written, rest = _span_fields(spans)
        if not rest:
            return written, []
        parts = [written]
    else:
        parts, rest = [], spans
    failed: list[tuple[LeanSpan, Exception]] = []
    for span in rest:
        try:
            parts.append(encode_span(span))
        except ENCODE_ERRORS as exc:
            failed.append((span, exc))
    return b"".join(parts), failed


def _python_span(span: LeanSpan) -> bytes:
    tid = span.trace_id
    if span.parent_id:
        ids = _IDS_PARENT.pack(0x0A, 16, tid >> 64, tid & _LOW64, 0x12, 8, span.span_id, 0x22, 8, span.parent_id)
    else:
        ids = _IDS.pack(0x0A, 16, tid >> 64, tid & _LOW64, 0x12, 8, span.span_id)
    parts = [ids, _head(span.name)[span.kind], _TIMES.pack(0x39, span.start_time, 0x41, span.end_time)]
    if span.trace_state:
        parts.append(_str(T3, span.trace_state.to_header()))
    if span.attributes:
        _attribute_fields(span.attributes, parts.append)
    if span.events or span.links or span.status is not None:
        parts += _rare_fields(span)
    elif span.parent_remote:
        parts += (_NO_STATUS, _FLAGS_REMOTE)
    else:
        parts.append(_TAIL_LOCAL)
    return _len(T2, b"".join(parts))


def _attribute_fields(attributes: dict[str, Any], append: Callable[[bytes], None]) -> None:
    """A span's attribute fields (tag 9), most from the cache: per key, value ->
    (its type, the finished field); the type because True == 1 == 1.0 as dict keys."""
    cache = _SPAN_FIELDS
    for key, value in attributes.items():
        by_value = cache.get(key)
        if by_value is not None:
            try:
                hit = by_value.get(value)
            except TypeError:  # unhashable (a list, a mapping): written each time
                hit = None
            if hit is not None and hit[0] is type(value):
                append(hit[1])
                continue
        append(_miss(key, value))


def _miss(key: str, value: Any) -> bytes:
    """The field of a value the cache does not have, stored when it may repeat.
    A key stops being stored once `_MAX_VALUES` of its values are (they hardly
    repeat: ids, sizes): its dict is dropped then."""
    field, keep = _new_field(key, value)
    if keep:
        by_value = _SPAN_FIELDS.get(key)
        if by_value is None:
            if len(_SPAN_FIELDS) >= _MAX_KEYS:
                return field
            by_value = _SPAN_FIELDS[key] = {}
        if len(by_value) >= _MAX_VALUES:
            _SPAN_FIELDS[key] = _NO_CACHE
        elif by_value is not _NO_CACHE:
            by_value[value] = (type(value), field)
    return field


def _new_field(key: str, value: Any) -> tuple[bytes, bool]:
    """An attribute field (tag 9), written from the key's heads (its KeyValue
    field but the value's bytes, by the value's length), and whether it may be
    cached (a str, an int, a bool, a tuple of str: not a float, a
    measurement, nor a tuple of numbers, which could equal one of bools)."""
    kind = type(value)
    heads = _HEADS_BY_KEY.get(key)
    if heads is None:
        heads = {}
        if len(_HEADS_BY_KEY) < _MAX_KEYS:
            _HEADS_BY_KEY[key] = heads
    if kind is str:
        raw = value.encode()
        head = heads.get(len(raw))
        if head is None:
            head = _keep_head(heads, len(raw), _str_head(_key(key), len(raw)))
        return head + raw, True
    if kind is int:
        raw = _int64(value)
        head = heads.get(-len(raw))
        if head is None:
            head = _keep_head(heads, -len(raw), _scalar_head(_key(key), b"\x18", len(raw)))
        return head + raw, True
    if kind is float:
        head = heads.get(_DOUBLE_HEAD)
        if head is None:
            head = _keep_head(heads, _DOUBLE_HEAD, _scalar_head(_key(key), b"\x21", 8))
        return head + _DOUBLE.pack(value), False
    if kind is dict:
        return _field(T9, key, _pairs(value)), False
    keep = kind is bool or (kind is tuple and all(type(v) is str for v in value))
    return _field(T9, key, value), keep


_DOUBLE_HEAD = -100  # a key's heads: by a str value's length, minus an int's varint length, or this


def _keep_head(heads: dict[int, bytes], n: int, head: bytes) -> bytes:
    if len(heads) < _MAX_HEADS:
        heads[n] = head
    return head


def _str_head(key_field: bytes, n: int) -> bytes:
    """A KeyValue field (tag 9) whose value is a string of `n` bytes, without those bytes."""
    value_head = T1 + _varint(n)  # AnyValue.string_value, its length
    any_len = len(value_head) + n
    kv_len = len(key_field) + 1 + len(_varint(any_len)) + any_len
    return T9 + _varint(kv_len) + key_field + T2 + _varint(any_len) + value_head


def _scalar_head(key_field: bytes, value_tag: bytes, n: int) -> bytes:
    """... whose value is an int (`n` varint bytes, tag 3) or a double (8 bytes, tag 4)."""
    any_len = 1 + n
    kv_len = len(key_field) + 1 + len(_varint(any_len)) + any_len
    return T9 + _varint(kv_len) + key_field + T2 + _varint(any_len) + value_tag


def _rare_fields(span: LeanSpan) -> list[bytes]:
    """Events, links, status and flags: of the control plane's spans and the request path's errors."""
    parts = []
    for timestamp, event_name, event_attrs in span.events:
        body = b"\x09" + struct.pack("<Q", timestamp) + _str(T2, event_name) + _attributes(T3, event_attrs)
        parts.append(_len(T11, body))
    for link in span.links or ():
        lc = link.context
        body = _len(T1, lc.trace_id.to_bytes(16, "big")) + _len(T2, lc.span_id.to_bytes(8, "big"))
        parts.append(_len(T13, body + _attributes(T4, link.attributes) + _LINK_FLAGS[bool(lc.is_remote)]))
    status = span.status
    if status is not None and status.status_code.value:
        code = b"\x18" + _varint(status.status_code.value)
        parts.append(_len(T15, (_str(T2, status.description) if status.description else b"") + code))
    else:
        parts.append(_NO_STATUS)
    parts.append(_FLAGS_REMOTE if span.parent_remote else _FLAGS_LOCAL)
    return parts


def resource_head(attributes: Mapping[str, Any]) -> bytes:
    """The `resource` field of a ResourceSpans message (written once per process)."""
    return _len(T1, _attributes(T1, attributes))


def scope_head(name: str, version: str = "") -> bytes:
    """The `scope` field of a ScopeSpans message (written once per process)."""
    return _len(T1, _str(T1, name) + (_str(T2, version) if version else b""))


def wrap_spans(resource: bytes, scope: bytes, spans: list[bytes]) -> bytes:
    """The serialised `ExportTraceServiceRequest` of encoded spans (`encode_span`),
    all of one resource and scope (`resource_head`, `scope_head`)."""
    if not spans:
        return b""
    # One join of every piece, lengths first: nesting `_len` copied the whole
    # batch (~1.5 MB at 4096 spans) once per level, ~5 % of a traced gateway's CPU.
    scope_len = len(scope) + sum(map(len, spans))
    scope_spans = T2 + _varint(scope_len)
    return b"".join([T1, _varint(len(resource) + len(scope_spans) + scope_len), resource, scope_spans, scope, *spans])


def encode_spans(spans: Sequence[Any]) -> bytes:
    """The serialised `ExportTraceServiceRequest` of SDK `ReadableSpan`s,
    grouped by resource and instrumentation scope as the collector expects."""
    groups: dict[int, tuple[Any, dict[tuple[str, str], list[LeanSpan]]]] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        entry = groups.setdefault(id(resource), (resource, {}))
        entry[1].setdefault(key, []).append(LeanSpan.from_readable(span))
    out = []
    for resource, scopes in groups.values():
        body = resource_head(resource.attributes) if resource is not None else b""
        for (name, version), records in scopes.items():
            body += _len(T2, scope_head(name, version) + b"".join([encode_span(s) for s in records]))
        out.append(_len(T1, body))
    return b"".join(out)
