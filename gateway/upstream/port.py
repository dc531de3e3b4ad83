"""The port to the worker's internal API (`workers.protocol`).

`WorkerAPI` is what the orchestrator, registry and switcher use; every
method takes the worker's base URL. `upstream.http_client.HttpWorkerClient`
(httpx) and `upstream.raw_client.RawWorkerClient` implement it;
`testing.fake_worker.InProcessWorkerClient` is the in-memory fake.

Failure contract:
- `WorkerUnreachable`: connect refused/reset, timeout, or a stream that ended
  without a final chunk. The node may be dead; the caller decides.
- `WorkerRejected`: the worker answered with `ErrorResponse`; `retryable`
  says another node may take the same request (wrong phase, draining, full).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

import httpx
from pydantic import ValidationError

from gateway.http.errors import UpstreamFailed
from workers.protocol import (
    AbortResponse,
    ErrorResponse,
    FenceStatus,
    GenerateChunk,
    GenerateRequest,
    MigrateRequest,
    MigrateResponse,
    PhaseChangeRequest,
    PhaseChangeResult,
    PhaseStatus,
    WorkerStats,
)


class WorkerError(UpstreamFailed):
    """A worker call failed. Base of the worker failures below."""


class WorkerUnreachable(WorkerError):
    code = "worker_unreachable"

    @property
    def refused(self) -> bool:
        """Nothing listens there (connection refused): the worker is gone,
        unlike a timeout, which a busy worker can cause."""
        cause = self.__cause__
        if isinstance(cause, ConnectionRefusedError):  # the raw client (gateway.upstream.raw_client)
            return True
        return isinstance(cause, httpx.ConnectError) and not isinstance(cause, httpx.ConnectTimeout)


class WorkerRejected(WorkerError):
    code = "worker_rejected"

    def __init__(
        self, message: str, *, status: int, retryable: bool, detail: str | None = None, error_type: str = ""
    ) -> None:
        super().__init__(message)
        self.status_code = status
        self.retryable = retryable
        self.detail = detail if detail is not None else message  # the worker's own words, no prefix
        self.error_type = error_type  # the worker's `ErrorBody.type`, e.g. "stale_term"

    @property
    def stale_term(self) -> bool:
        """The worker refused an order of a superseded leadership term (`workers.fence`)."""
        return self.status_code == 409 and self.error_type == "stale_term"


# A stream's consumer taking chunks as they arrive, between two of its reads:
# True when it took the chunk, False when it refused it and changed nothing
# (the chunk is then yielded as usual). Called from the client's I/O
# callbacks, so it must not block and should not raise.
ChunkLane = Callable[[GenerateChunk], bool]


class WorkerAPI(Protocol):
    def generate_stream(
        self, url: str, req: GenerateRequest, *, lane: ChunkLane | None = None
    ) -> AsyncIterator[GenerateChunk]:
        """Yield chunks until (and including) the one with `finish_reason`.

        Closing the iterator early closes the connection; the worker aborts.
        `lane`, when given, may be offered chunks while the caller waits for
        the next one (`ChunkLane`): a chunk it takes is not yielded. Chunks
        reach the caller in order either way; a client may never offer any.
        """

    async def generate(self, url: str, req: GenerateRequest) -> GenerateChunk: ...
    async def abort(self, url: str, request_id: str) -> AbortResponse: ...
    async def migrate(self, url: str, req: MigrateRequest) -> MigrateResponse: ...
    async def phase(self, url: str) -> PhaseStatus: ...
    async def change_phase(self, url: str, req: PhaseChangeRequest, *, timeout_s: float) -> PhaseChangeResult: ...
    async def stats(self, url: str, since: int = 0) -> WorkerStats: ...
    async def fence(self, url: str, term: int) -> FenceStatus:
        """Tell the worker the newest leadership term (`workers.fence`)."""

    async def ready(self, url: str) -> bool: ...
    async def aclose(self) -> None: ...


def rejected_error(status: int, body: bytes) -> WorkerRejected:
    """The `WorkerRejected` for an error answer (an `ErrorResponse` body, or whatever the worker sent)."""
    try:
        err = ErrorResponse.model_validate_json(body).error
        return WorkerRejected(
            f"worker {err.type}: {err.message}",
            status=status,
            retryable=err.retryable,
            detail=err.message,
            error_type=err.type,
        )
    except ValidationError:
        text = body[:200].decode(errors="replace")
        return WorkerRejected(f"worker HTTP {status}: {text}", status=status, retryable=status in (429, 503))
