"""`WorkerAPI` (gateway.upstream.port) over one persistent `httpx.AsyncClient` pool."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from gateway.upstream.port import ChunkLane, WorkerRejected, WorkerUnreachable, rejected_error
from gateway.upstream.wire import BadChunk, decode_chunks, encode_generate
from workers.protocol import (
    AbortRequest,
    AbortResponse,
    FenceRequest,
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


class HttpWorkerClient:
    """`WorkerAPI` over HTTP/1.1 with one keep-alive connection pool."""

    def __init__(
        self,
        *,
        cluster_token: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 300.0,
        max_connections: int = 1024,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
            headers={"authorization": f"Bearer {cluster_token}"} if cluster_token else None,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, url: str, body: str | bytes, *, timeout_s: float | None = None) -> bytes:
        try:
            headers = {"content-type": "application/json"}
            if timeout_s is None:
                resp = await self._http.post(url, content=body, headers=headers)
            else:
                resp = await self._http.post(url, content=body, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise WorkerUnreachable(f"{url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise rejected_error(resp.status_code, resp.content)
        return resp.content

    async def _get(self, url: str, params: dict[str, int] | None = None) -> bytes:
        try:
            resp = await self._http.get(url, params=params, timeout=5.0)
        except httpx.HTTPError as exc:
            raise WorkerUnreachable(f"{url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise rejected_error(resp.status_code, resp.content)
        return resp.content

    async def generate_stream(
        self, url: str, req: GenerateRequest, *, lane: ChunkLane | None = None
    ) -> AsyncIterator[GenerateChunk]:
        del lane  # every chunk is yielded (the lane is an offer, see `WorkerAPI`)
        body = encode_generate(req, stream=True)
        request = self._http.build_request(
            "POST", f"{url}/internal/generate", content=body, headers={"content-type": "application/json"}
        )
        try:
            resp = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise WorkerUnreachable(f"{url}: {type(exc).__name__}: {exc}") from exc
        try:
            if resp.status_code >= 400:
                raise rejected_error(resp.status_code, await resp.aread())
            finished = False
            pending = b""
            raw = resp.aiter_raw()
            async for data in raw:
                pending += data
                *lines, pending = pending.split(b"\n")
                for chunk in decode_chunk_lines(lines):
                    if chunk.finish_reason is not None:
                        # Read to the end of the body *before* handing out the
                        # last chunk (the consumer may stop at it): a fully read
                        # response returns its connection to the keep-alive pool.
                        async for _ in raw:
                            pass
                        yield chunk
                        return
                    yield chunk
            if pending.strip():
                chunk = _parse_chunk(pending)
                finished = chunk.finish_reason is not None
                yield chunk
            if not finished:
                raise WorkerUnreachable(f"{url}: stream ended without a final chunk")
        except httpx.HTTPError as exc:
            raise WorkerUnreachable(f"{url}: stream broke: {type(exc).__name__}: {exc}") from exc
        finally:
            await resp.aclose()

    async def generate(self, url: str, req: GenerateRequest) -> GenerateChunk:
        return _parse_chunk(await self._post(f"{url}/internal/generate", encode_generate(req, stream=False)))

    async def abort(self, url: str, request_id: str) -> AbortResponse:
        raw = await self._post(
            f"{url}/internal/abort", AbortRequest(request_id=request_id).model_dump_json(), timeout_s=5.0
        )
        return AbortResponse.model_validate_json(raw)

    async def migrate(self, url: str, req: MigrateRequest) -> MigrateResponse:
        return MigrateResponse.model_validate_json(await self._post(f"{url}/internal/migrate", req.model_dump_json()))

    async def phase(self, url: str) -> PhaseStatus:
        return PhaseStatus.model_validate_json(await self._get(f"{url}/internal/phase"))

    async def change_phase(self, url: str, req: PhaseChangeRequest, *, timeout_s: float) -> PhaseChangeResult:
        raw = await self._post(f"{url}/internal/phase", req.model_dump_json(), timeout_s=timeout_s)
        return PhaseChangeResult.model_validate_json(raw)

    async def stats(self, url: str, since: int = 0) -> WorkerStats:
        return WorkerStats.model_validate_json(await self._get(f"{url}/internal/stats", {"since": since}))

    async def fence(self, url: str, term: int) -> FenceStatus:
        raw = await self._post(f"{url}/internal/fence", FenceRequest(term=term).model_dump_json(), timeout_s=5.0)
        return FenceStatus.model_validate_json(raw)

    async def ready(self, url: str) -> bool:
        try:
            resp = await self._http.get(f"{url}/readyz", timeout=2.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200


def _parse_chunk(line: bytes) -> GenerateChunk:
    return decode_chunk_lines([line])[0]


def decode_chunk_lines(lines: list[bytes]) -> list[GenerateChunk]:
    """Complete NDJSON lines -> coalesced chunks; a bad line is a `WorkerRejected` (502)."""
    try:
        return decode_chunks(lines)
    except BadChunk as exc:
        # A worker speaking a different protocol version is a bug, not a dead node.
        raise WorkerRejected(str(exc), status=502, retryable=False) from exc


__all__ = ["HttpWorkerClient", "decode_chunk_lines"]
