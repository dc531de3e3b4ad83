"""The gateway's own record of the requests it served (pure: no I/O).

Every API request, answered or refused, leaves one `RequestRecord` in a
bounded ring (`RequestLog`, the newest `size` records) that operators read
at `GET /admin/requests`: what a client got, on which branch, with how many
prompt, cached and output tokens, without a trace backend or a log search.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    request_id: str | None  # None: refused before it was given one
    api: str  # "openai", "responses", "anthropic"
    endpoint: str  # "chat", "completions", "responses", "messages"
    tenant: str | None  # None: refused before the key was checked
    branch_id: str | None
    session: str | None
    status: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int  # over every choice
    finish_reason: str | None  # the first choice's
    start: float  # unix seconds
    duration_s: float


class RequestLog:
    """The newest `size` records, oldest first out."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("the request log holds at least one record")
        self._records: collections.deque[RequestRecord] = collections.deque(maxlen=size)

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)

    def recent(self, limit: int, *, branch: str | None = None) -> list[RequestRecord]:
        """Up to `limit` records, newest first; only `branch`'s when given."""
        out: list[RequestRecord] = []
        for record in reversed(self._records):
            if branch is None or record.branch_id == branch:
                out.append(record)
                if len(out) == limit:
                    break
        return out

    def __len__(self) -> int:
        return len(self._records)
