"""The worker protocol's bytes on the gateway side: request bodies out,
NDJSON chunk lines in, with as little per-request Python as the contract allows.

- `encode_generate(req, stream=...)`: the `GenerateRequest` body. orjson over
  the model's own field values (no `model_copy`, no pydantic serializer):
  every field the model has goes out, so a field added to the protocol is
  never dropped here, and the result validates back to the same request
  (tested). For a 661k-token prompt this is ~4 ms instead of ~34 ms of
  validation and `model_dump_json` on the event loop.
- `decode_chunks(lines)`: all NDJSON lines of one read validated in *one*
  pydantic call (`list[GenerateChunk]`), then merged (`coalesce`). A line
  that does not validate is reported with its own error (`WorkerRejected`,
  502): a worker speaking another protocol version is a bug, not a dead node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from workers.protocol import GenerateChunk, GenerateRequest

_CHUNKS: TypeAdapter[list[GenerateChunk]] = TypeAdapter(list[GenerateChunk])


class BadChunk(Exception):
    """A line the worker sent that is not a `GenerateChunk` (the caller maps it to its error type)."""


def _fields(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return dict(value)  # the model's field values, nested models left to this hook
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode_generate(req: GenerateRequest, *, stream: bool) -> bytes:
    """`req` as the worker's JSON body with `stream` set."""
    body = dict(req)
    body["stream"] = stream
    return orjson.dumps(body, default=_fields)


def parse_chunk(line: bytes) -> GenerateChunk:
    try:
        return GenerateChunk.model_validate_json(line)
    except ValidationError as exc:
        raise BadChunk(f"bad chunk from worker: {exc.errors()[:1]}") from exc


def decode_chunks(lines: Sequence[bytes]) -> list[GenerateChunk]:
    """The chunks of complete NDJSON lines (blank lines skipped), merged by `coalesce`."""
    lines = [line for line in lines if line.strip()]
    if not lines:
        return []
    if len(lines) == 1:
        return [parse_chunk(lines[0])]
    try:
        chunks = _CHUNKS.validate_json(b"[" + b",".join(lines) + b"]")
    except ValidationError:
        chunks = [parse_chunk(line) for line in lines]  # names the bad line (raises)
    return coalesce(chunks)


def coalesce(chunks: list[GenerateChunk]) -> list[GenerateChunk]:
    """Merge runs of token-only chunks of one request that arrived in one read
    (fewer, larger deltas downstream under load): a chunk joins the run before
    it unless that run already ended (finish reason, saved blocks or error)."""
    out: list[GenerateChunk] = []
    i, n = 0, len(chunks)
    while i < n:
        j = i + 1
        while j < n and _joins(chunks[j - 1], chunks[j]):
            j += 1
        if j == i + 1:
            out.append(chunks[i])
        else:
            run, last = chunks[i:j], chunks[j - 1]
            merged = {
                "token_ids": [t for c in run for t in c.token_ids],
                "text": "".join(c.text for c in run),
                "finish_reason": last.finish_reason,
                "saved_blocks": last.saved_blocks,
                "error": last.error,
                "error_type": last.error_type,
                "cached_tokens": max(c.cached_tokens for c in run),
                "external_cached_tokens": max(c.external_cached_tokens for c in run),
                # one entry per token, in order, when the request asked for them
                "logprobs": (
                    [lp for c in run for lp in c.logprobs or ()] if any(c.logprobs is not None for c in run) else None
                ),
            }
            out.append(chunks[i].model_copy(update=merged))  # one copy per run, not a setattr per field and chunk
        i = j
    return out


def _joins(prev: GenerateChunk, chunk: GenerateChunk) -> bool:
    return (
        prev.finish_reason is None and not prev.saved_blocks and not prev.error and chunk.request_id == prev.request_id
    )
