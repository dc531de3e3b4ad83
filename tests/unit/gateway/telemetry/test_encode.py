"""gateway.telemetry._encode writes what the SDK's own OTLP encoder writes:
both outputs decoded with the OpenTelemetry proto package compare equal
(whole requests of SDK spans, and the request path's span-by-span bytes),
with the C encoder of common spans (`_spanwire`) and with the Python one
alone; the two write the same bytes, and the C one hands every span it does
not write back to the Python one (test_spanwire.py)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context

from gateway.telemetry import _encode
from gateway.telemetry._encode import encode_span, encode_spans, resource_head, scope_head, wrap_spans
from gateway.telemetry._ids import parse_traceparent
from gateway.telemetry._lean import LeanSpan

C_ENCODER = _encode._span_field


@pytest.fixture(params=["c", "python"], autouse=True)
def encoder(request, monkeypatch) -> str:
    """Every test with either encoder: "python" runs without the C one."""
    if request.param == "python":
        monkeypatch.setattr(_encode, "_span_field", None)
    elif C_ENCODER is None:
        pytest.skip("the C span encoder is not built here")
    return request.param


def _spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "gw", "service.instance.id": "r1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("evolving-infra.gateway", "1.0")
    remote = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")
    assert remote is not None
    from opentelemetry.trace import NonRecordingSpan

    root = tracer.start_span("chat m", set_span_in_context(NonRecordingSpan(remote)), SpanKind.SERVER, {"a": 1})
    root.set_attributes(
        {
            "s": "text",
            "neg": -5,
            "big": 2**40,
            "f": 0.25,
            "b": True,
            "no": False,
            "arr": ("x", "y"),
            "ints": (1, 2, 3),
            "empty": "",
        }
    )
    child = tracer.start_span("decode", set_span_in_context(root), SpanKind.CLIENT, {"evolving.node": "w1"})
    child.add_event("migrated", {"tokens": 7})
    child.set_status(Status(StatusCode.ERROR, "node failed"))
    child.end()
    linked = tracer.start_span("phase.switch", links=[Link(child.get_span_context(), {"evolving.link": "migrated"})])
    linked.set_status(Status(StatusCode.OK))
    linked.end()
    root.end()
    other = TracerProvider(resource=Resource.create({"service.name": "other"})).get_tracer("x")
    lone = other.start_span("lone", kind=SpanKind.INTERNAL)
    lone.end()
    return [*exporter.get_finished_spans(), lone]


def _decoded(data: bytes) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    req.ParseFromString(data)
    return req


def test_same_message_as_the_sdk_encoder() -> None:
    spans = _spans()
    ours = _decoded(encode_spans(spans))
    theirs = _decoded(sdk_encode_spans(spans).SerializeToString())
    assert len(ours.resource_spans) == 2
    assert ours == theirs


def test_no_span_is_an_empty_request() -> None:
    assert encode_spans([]) == b""


def _one_request(spans: list) -> ExportTraceServiceRequest:
    """The SDK spans of one resource and scope, through the request path's encoder."""
    first = spans[0]
    head = resource_head(first.resource.attributes)
    scope = scope_head(first.instrumentation_scope.name, first.instrumentation_scope.version or "")
    return _decoded(wrap_spans(head, scope, [encode_span(LeanSpan.from_readable(s)) for s in spans]))


def test_the_request_paths_span_bytes_are_the_sdk_encoders() -> None:
    spans = [s for s in _spans() if s.name != "lone"]  # one resource and scope, as one process has
    assert _one_request(spans) == _decoded(sdk_encode_spans(spans).SerializeToString())


def test_equal_values_of_other_types_are_not_mixed_up_by_the_cache() -> None:
    # True == 1 == 1.0 as dict keys: each must still be written as its own type
    spans = [LeanSpan(None, f"s{i}", 7, 0, 1, {"x": v}, 1) for i, v in enumerate((1, True, 1.0, 1, True))]
    for s in spans:
        s.end_time = 2
    req = _decoded(wrap_spans(resource_head({}), scope_head("t"), [encode_span(s) for s in spans]))
    values = [s.attributes[0].value for s in req.resource_spans[0].scope_spans[0].spans]
    assert [v.WhichOneof("value") for v in values] == ["int_value", "bool_value", "double_value"] + [
        "int_value",
        "bool_value",
    ]


def test_a_mapping_value_is_written_as_sorted_name_value_strings() -> None:
    span = LeanSpan(None, "route", 7, 0, 1, {"cached": {"w2": 0, "w1": 256}}, 1)
    span.end_time = 2
    req = _decoded(wrap_spans(resource_head({}), scope_head("t"), [encode_span(span)]))
    (attr,) = req.resource_spans[0].scope_spans[0].spans[0].attributes
    assert [v.string_value for v in attr.value.array_value.values] == ["w1=256", "w2=0"]


def test_no_span_is_an_empty_body() -> None:
    assert wrap_spans(resource_head({}), scope_head("t"), []) == b""


def _attribute_values(attrs: dict) -> list:
    """The attributes of a span written twice (the second time from the cache), decoded."""
    spans = [LeanSpan(None, "s", 7, 0, 1, dict(attrs), 1) for _ in range(2)]
    for s in spans:
        s.end_time = 2
    req = _decoded(wrap_spans(resource_head({}), scope_head("t"), [encode_span(s) for s in spans]))
    return [[(a.key, a.value) for a in s.attributes] for s in req.resource_spans[0].scope_spans[0].spans]


def test_values_of_every_length_and_sign_are_written_alike_from_the_cache() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

    long_key = "evolving." + "k" * 150
    attrs = {
        "short": "a",
        "empty": "",
        "long": "é" * 200,  # 400 bytes: a two-byte length
        long_key: 3,
        "neg": -(2**40),
        "max": 2**63 - 1,
        "f": -0.0,
        "yes": True,
        "names": ("w1", "w2"),
        "ints": (1, 2),
    }
    first, second = _attribute_values(attrs)
    assert first == second
    want = {
        "short": AnyValue(string_value="a"),
        "empty": AnyValue(string_value=""),
        "long": AnyValue(string_value="é" * 200),
        long_key: AnyValue(int_value=3),
        "neg": AnyValue(int_value=-(2**40)),
        "max": AnyValue(int_value=2**63 - 1),
        "f": AnyValue(double_value=-0.0),
        "yes": AnyValue(bool_value=True),
        "names": AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in ("w1", "w2")])),
        "ints": AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=v) for v in (1, 2)])),
    }
    assert dict(first) == want


@pytest.mark.parametrize("encoder", ["python"], indirect=True)  # the Python encoder's cache
def test_a_key_whose_values_do_not_repeat_stops_being_cached(monkeypatch, encoder) -> None:
    monkeypatch.setattr(_encode, "_MAX_VALUES", 8)
    for i in range(20):
        ((key, value),), _ = _attribute_values({"evolving.test.id": f"req-{i}"})
        assert value.string_value == f"req-{i}"
    assert _encode._SPAN_FIELDS["evolving.test.id"] is _encode._NO_CACHE
    assert _attribute_values({"evolving.test.id": "req-3"})[0][0][1].string_value == "req-3"
