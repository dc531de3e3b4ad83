"""The C encoder of request-path spans (gateway/telemetry/_spanwire.c) writes
the Python encoder's bytes for every span it takes, hands back every span
it does not (the Python encoder then writes it or raises), and is built
wherever a C compiler is."""

from __future__ import annotations

import enum
import random
import shutil
import struct
import time
from typing import Any

import pytest
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceState

from gateway.telemetry import _encode, _lean
from gateway.telemetry._encode import encode_span
from gateway.telemetry._lean import LeanSpan

C_ENCODER = _encode._span_field
try:
    from gateway.telemetry import _spanwire
except ImportError:  # pragma: no cover - where the extension is not built
    _spanwire = None  # type: ignore[assignment]  # the tests that need it are skipped
needs_c = pytest.mark.skipif(C_ENCODER is None, reason="the C span encoder is not built here")


class Phase(str, enum.Enum):
    DECODE = "decode"


class Count(enum.IntEnum):
    TWO = 2


def _span(attributes: dict, *, parent: int = 0, remote: bool = False, state: TraceState | None = None) -> LeanSpan:
    span = LeanSpan(None, "decode", (0xABC << 100) | 12345, parent, 2, attributes, 1_700_000_000_000_000_000)
    span.span_id = 0x1234_5678_9ABC_DEF0
    span.end_time = span.start_time + 987_654
    span.parent_remote = remote
    span.trace_state = state
    return span


COMMON: list[dict[str, Any]] = [
    {},
    {"s": "text", "n": 7, "neg": -(2**40), "max": 2**63 - 1, "min": -(2**63), "f": 0.5, "yes": True, "no": False},
    {"names": ("w1", "w2"), "ints": (1, -2), "mixed": ("a", 1, 2.5, True), "none": (), "list": ["x", "y"]},
    {"phase": Phase.DECODE, "count": Count.TWO, "tuple_enum": (Phase.DECODE,)},
    {"unicode": "é✓ \U0001f600", "long": "k" * 5000, "evolving." + "k" * 300: 1},  # past the C buffer's first 1 KiB
    {f"key{i}": f"value-{i}" * 20 for i in range(60)},
]


@needs_c
@pytest.mark.parametrize("attributes", COMMON)
@pytest.mark.parametrize(
    ("parent", "remote", "state"),
    [(0, False, None), (0xFEED, False, None), (0xFEED, True, None), (0xFEED, True, TraceState([("k", "v")]))],
    ids=["root", "local-parent", "remote-parent", "remote-parent-tracestate"],
)
def test_the_c_encoder_writes_the_python_encoders_bytes(attributes, parent, remote, state, monkeypatch) -> None:
    span = _span(dict(attributes), parent=parent, remote=remote, state=state)
    assert C_ENCODER is not None
    written = C_ENCODER(
        span.trace_id >> 64,
        span.trace_id & (2**64 - 1),
        span.span_id,
        span.parent_id,
        _encode._head(span.name)[span.kind],
        span.start_time,
        span.end_time,
        _encode._str(_encode.T3, state.to_header()) if state else b"",
        span.attributes,
        _encode._TAIL_REMOTE if remote else _encode._TAIL_LOCAL,
    )
    assert written is not None
    assert encode_span(span) == written  # through the Python dispatch: the same
    monkeypatch.setattr(_encode, "_span_field", None)
    assert encode_span(_span(dict(attributes), parent=parent, remote=remote, state=state)) == written


@needs_c
@pytest.mark.parametrize(
    "value",
    [{"w1": 2}, (("a",),), 2**63, -(2**63) - 1, None, "\ud800", object(), (None,), b"raw"],
    ids=["mapping", "nested", "int-high", "int-low", "none", "surrogate", "object", "none-in-array", "bytes"],
)
def test_what_the_c_encoder_does_not_write_goes_to_the_python_one(value, monkeypatch) -> None:
    assert C_ENCODER is not None
    span = _span({"ok": "yes", "odd": value})
    assert C_ENCODER(12, 34, 5, 0, b"", 1, 2, b"", span.attributes, b"") is None
    monkeypatch.setattr(_encode, "_span_field", None)
    try:
        want: bytes | type[Exception] = encode_span(_span({"ok": "yes", "odd": value}))
    except (ValueError, TypeError, OverflowError) as exc:
        want = type(exc)
    monkeypatch.setattr(_encode, "_span_field", C_ENCODER)
    if isinstance(want, bytes):
        assert encode_span(span) == want
    else:
        with pytest.raises(want):
            encode_span(span)


@needs_c
def test_a_key_that_is_no_string_goes_to_the_python_encoder() -> None:
    assert C_ENCODER is not None
    not_str: Any = {7: "x"}
    assert C_ENCODER(1, 2, 3, 0, b"", 1, 2, b"", not_str, b"") is None


def test_the_c_encoder_is_built_where_a_compiler_is() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python encoder writes every span")
    assert C_ENCODER is not None, "gateway/telemetry/_spanwire.c was not built (pip install -e . builds it)"


# -- whole spans: span_fields, new_span, traceparent --------------------------------
def _rare(kind: str) -> LeanSpan:
    span = _span({"k": "v"})
    if kind == "status":
        span.status = Status(StatusCode.ERROR, "boom")
    elif kind == "link":
        span.add_link(SpanContext(1, 2, False))
    elif kind == "event":
        span.events = ((3, "e", {}),)
    elif kind == "state":
        span.trace_state = TraceState([("k", "v")])
    elif kind == "odd-value":
        span.attributes["odd"] = {"w1": 2}
    elif kind == "huge-trace-id":
        span.trace_id = 1 << 130
    return span


class SubSpan(LeanSpan):
    __slots__ = ()


@needs_c
def test_span_fields_writes_each_common_span_as_the_python_encoder_and_hands_back_the_rest(monkeypatch) -> None:
    common = [_span(dict(a), parent=p, remote=r) for a in COMMON for p, r in ((0, False), (7, False), (7, True))]
    rare = [_rare(k) for k in ("status", "link", "event", "state", "odd-value", "huge-trace-id")]
    sub = SubSpan(None, "sub", 9, 0, 1, {}, 1)
    sub.end_time = 2
    spans = [rare[0], *common[:5], rare[1], sub, *common[5:], *rare[2:]]
    assert _encode._span_fields is not None
    written, rest = _encode._span_fields(spans)
    assert rest == [rare[0], rare[1], sub, *rare[2:]]  # the others, in order
    monkeypatch.setattr(_encode, "_span_field", None)
    assert written == b"".join(_encode._python_span(s) for s in common)
    # through `span_fields`: the rest written by the Python encoder after them, or left out with why
    data, failed = _encode.span_fields(spans)
    assert [s for s, _ in failed] == [rare[-1]] and isinstance(failed[0][1], struct.error)
    assert data == written + b"".join(_encode._python_span(s) for s in [rare[0], rare[1], sub, *rare[2:-1]])


def test_span_fields_without_the_c_encoder_writes_the_same(monkeypatch) -> None:
    spans = [_span(dict(a), parent=7) for a in COMMON] + [_rare("status")]
    want = _encode.span_fields(spans)
    monkeypatch.setattr(_encode, "_span_fields", None)
    monkeypatch.setattr(_encode, "_span_field", None)
    assert _encode.span_fields(spans) == want and want[1] == []


@needs_c
def test_new_span_fills_every_slot_as_the_constructor_does() -> None:
    put, attrs, state = print, {"a": 1}, TraceState([("k", "v")])
    made = _lean.new_span(put, "route", 1 << 100, 77, 2, attrs, 123, state)
    built = LeanSpan(put, "route", 1 << 100, 77, 2, attrs, 123, state)
    assert type(made) is LeanSpan and made.attributes is attrs
    for slot in LeanSpan.__slots__:
        if slot != "span_id":
            assert getattr(made, slot) == getattr(built, slot), slot
    assert 0 < made.span_id < 1 << 64 and made.span_id != built.span_id
    for make in (_lean.new_span, LeanSpan):  # C, and what stands in for it without the extension
        before = time.time_ns()
        now = make(None, "x", 1, 0, 0, {}, None, None)
        assert before <= now.start_time <= time.time_ns() and now.trace_state is None and now.is_recording()


@needs_c
def test_traceparent_is_the_w3c_header_of_the_span() -> None:
    rng = random.Random(3)
    for _ in range(1000):
        trace_id, span_id = rng.getrandbits(128) or 1, rng.getrandbits(64) or 1
        assert _spanwire.traceparent(trace_id, span_id) == f"00-{trace_id:032x}-{span_id:016x}-01"
    with pytest.raises(OverflowError):
        _spanwire.traceparent(1 << 128, 1)
