"""Reading request bodies: a size limit (413) and JSON objects (400), OpenAI-shaped errors."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from gateway.http.errors import InvalidRequest, PayloadTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; 413 as soon as it is declared or read past `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    # Straight from `receive` (what `Request.stream` does, less an async generator per request).
    parts: list[bytes] = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        if not message.get("more_body", False):
            if not parts:
                return part  # the whole body in one message: no copy
            parts.append(part)
            return b"".join(parts)
        parts.append(part)


def json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    return data
