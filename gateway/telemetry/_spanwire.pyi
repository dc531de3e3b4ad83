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
