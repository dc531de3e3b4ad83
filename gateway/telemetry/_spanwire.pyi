from collections.abc import Callable
from typing import Any

def span_field(
    trace_hi: int,
    trace_lo: int,
    span_id: int,
    parent_id: int,
    head: bytes,
    start: int,
    end: int,
    state: bytes,
    attributes: dict[str, Any],
    tail: bytes,
    /,
) -> bytes | None: ...
def span_fields(spans: list[Any], /) -> tuple[bytes, list[Any]]: ...
def configure(cls: type, getrandbits: Callable[[int], int], /) -> None: ...
def new_span(
    put: Callable[[Any], None] | None,
    name: str,
    trace_id: int,
    parent_id: int,
    kind: int,
    attributes: dict[str, Any],
    start_time: int | None,
    trace_state: Any,
    /,
) -> Any: ...
def traceparent(trace_id: int, span_id: int, /) -> str: ...
