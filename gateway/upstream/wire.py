"""The worker protocol's bytes on the gateway side: request bodies out,
NDJSON chunk lines in, with as little per-request Python as the contract allows.

- `encode_generate(req, stream=...)`: the `GenerateRequest` body. orjson over
  the model's own field values (no `model_copy`, no pydantic serializer):
  every field the model has goes out, so a field added to the protocol is
  never dropped here, and the result validates back to the same request
  (tested). For a 661k-token prompt this is ~4 ms instead of ~34 ms of
  validation and `model_dump_json` on the event loop.
- `decode_chunks(lines)`: the NDJSON lines of one read parsed by orjson,
  runs of lines of one request merged as plain dicts (`coalesce`),
  then each merged chunk validated by pydantic once: 16 lines that arrive
  together are one validation, not 16 and a model copy. A line that does
  not validate is reported with its own error (`WorkerRejected`, 502): a
  worker speaking another protocol version is a bug, not a dead node.
- `offer_line(lane)`: a read's bytes -> the lane's answer when they are one
  whole chunk line (a long stream's usual read), False otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from workers.protocol import GenerateChunk, GenerateRequest

# `GenerateChunk.model_validate_json` without its wrapper's argument checks (called once a relayed token)
_validate_json = GenerateChunk.__pydantic_validator__.validate_json


class BadChunk(Exception):
    """A line the worker sent that is not a `GenerateChunk` (the caller maps it to its error type)."""


def _fields(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        # The model's field values (the models here forbid extra fields), nested models left to this hook.
        return value.__dict__
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode_generate(req: GenerateRequest, *, stream: bool) -> bytes:
    """`req` as the worker's JSON body with `stream` set."""
    body = dict(req.__dict__)
    body["stream"] = stream
    return orjson.dumps(body, default=_fields)


def parse_chunk(line: bytes) -> GenerateChunk:
    try:
        chunk: GenerateChunk = _validate_json(line)
    except ValidationError as exc:
        raise BadChunk(f"bad chunk from worker: {exc.errors()[:1]}") from exc
    return chunk


def offer_line(lane: Callable[[GenerateChunk], bool]) -> Callable[[bytes], bool]:
    """A reader of raw body reads for `lane`: a read that is exactly one
    chunk line is parsed and offered (the lane's answer returned); anything
    else (a partial line, several lines, a line that does not validate) is
    refused untouched, for the stream to read and report as usual."""

    def offer(data: bytes) -> bool:
        if data.find(b"\n") != len(data) - 1:
            return False
        try:
            chunk = _validate_json(data)  # `parse_chunk`, inline (a relayed token's call)
        except ValidationError:
            return False
        return lane(chunk)

    return offer


def decode_chunks(lines: Sequence[bytes]) -> list[GenerateChunk]:
    """The chunks of complete NDJSON lines (blank lines skipped), merged by `coalesce`."""
    if len(lines) == 1:  # one token a read: a long stream's usual case
        line = lines[0]
        return [parse_chunk(line)] if line.strip() else []
    lines = [line for line in lines if line.strip()]
    if len(lines) <= 1:
        return [parse_chunk(line) for line in lines]
    try:
        docs = orjson.loads(b"[" + b",".join(lines) + b"]")
        return [GenerateChunk.model_validate(doc) for doc in coalesce(docs)]
    except (orjson.JSONDecodeError, ValidationError, AttributeError, TypeError):
        # A line of the wrong JSON shape (AttributeError, TypeError: met while merging) is
        # named by its own validation; lines pydantic reads but a merge cannot go unmerged.
        return [parse_chunk(line) for line in lines]


_FIELDS = frozenset(GenerateChunk.model_fields)
_ENDS = ("finish_reason", "saved_blocks", "error", "error_type")
_CLOSERS = frozenset(("finish_reason", "saved_blocks", "error"))  # a run ends at a document with one of these set


def _closes(doc: dict[str, Any]) -> bool:
    """`doc` ends the run it is in (finish reason, saved blocks or error set);
    called where `_CLOSERS` is not disjoint from its keys (the usual token
    line has none of them: one set test, no call)."""
    return doc.get("finish_reason") is not None or bool(doc.get("saved_blocks")) or bool(doc.get("error"))


def coalesce(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge runs of chunk documents (decoded JSON lines) of one request that
    arrived in one read (fewer, larger deltas downstream under load): a
    document joins the run before it unless that run already ended (finish
    reason, saved blocks or error). A merged run carries the ends
    (`_ENDS`) of its last document. Merged documents are new dicts; a field
    of the wrong JSON type either raises here (TypeError, AttributeError) or
    reaches pydantic, which refuses it; a field a chunk does not have ends
    the run, so it reaches pydantic too.

    Written for the loop it runs on (a 16-token read is 16 documents): one
    set test per document for the run's end, the ends copied once per run."""
    out: list[dict[str, Any]] = []
    run: dict[str, Any] | None = None  # out[-1] when it is a merge of ours
    last: dict[str, Any] = {}  # the run's last document (its ends are the run's)
    joinable = False  # the next document of the same request may join out[-1]
    rid: Any = None
    for doc in docs:
        if joinable and doc.get("request_id") == rid and doc.keys() <= _FIELDS:
            if run is None:
                run = out[-1] = _started(out[-1])
            _extend(run, doc)
            last = doc
        else:
            if run is not None:
                _set_ends(run, last)
            out.append(doc)
            run = None
            rid = doc.get("request_id")
            if not doc.keys() <= _FIELDS:
                joinable = False
                continue
        joinable = _CLOSERS.isdisjoint(doc) or not _closes(doc)
    if run is not None:
        _set_ends(run, last)
    return out


def _started(first: dict[str, Any]) -> dict[str, Any]:
    run = dict(first)  # the first line's request id and prompt_tokens
    run["token_ids"] = list(first.get("token_ids", ()))
    run["text"] = first.get("text", "")
    lps = first.get("logprobs")
    run["logprobs"] = None if lps is None else list(lps)
    return run


def _extend(run: dict[str, Any], doc: dict[str, Any]) -> None:
    run["token_ids"].extend(doc.get("token_ids", ()))
    if "text" in doc:
        run["text"] += doc["text"]
    for key in ("cached_tokens", "external_cached_tokens"):
        if key in doc:
            run[key] = max(run.get(key, 0), doc[key])
    lps = doc.get("logprobs")
    if lps is not None:  # one entry per token, in order, when the request asked for them
        run["logprobs"] = [*(run["logprobs"] or ()), *lps]


def _set_ends(run: dict[str, Any], last: dict[str, Any]) -> None:
    for key in _ENDS:
        run[key] = last.get(key)
