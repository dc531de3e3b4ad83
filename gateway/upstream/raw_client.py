"""`RawWorkerClient`: the `WorkerAPI` with generate calls over pooled raw
HTTP/1.1 keep-alive connections (asyncio protocol + the `httptools` parser).

Why not httpx here: under load the httpx worker client was ~55 % of the
gateway process (docs/benchmarks.md, profile). Its pool scans every pooled
connection per request with a `select()` per idle one, and a 16-token
stream costs ~3,300 Python calls; this client costs ~80-220 µs of CPU per
call against ~1,900-2,100 µs for httpx (aiohttp: 206-423). The protocol it
speaks is one fixed shape (POST JSON, answer JSON or NDJSON, always
content-length or chunked), so the client stays small: the parsing is
httptools', the pool is a LIFO list of idle connections per worker. The
rare control calls (stats, phase, abort, migrate) go to `control`
(`HttpWorkerClient` by default).

Contract (same as `HttpWorkerClient`, see `gateway.upstream.http_client`):
- `WorkerUnreachable` for refused/reset connections, connect timeouts
  (`connect_timeout_s`), no bytes for `read_timeout_s` (between chunks of a
  stream too), or a body that ended without a final chunk; `refused` is
  True only for a refused connection.
- `WorkerRejected` for an `ErrorResponse` (4xx/5xx) or a line that is not a
  `GenerateChunk` (502).
- A connection returns to the pool only after its response was read to
  the end. A stream closed early closes its connection (the worker aborts).
- A reused idle connection the worker closed before answering (keep-alive
  race) is retried once on a fresh connection; nothing else is retried.
- At most `max_connections` calls hold a connection at once; more wait.
- A stream's `lane` (`gateway.upstream.port.ChunkLane`) is offered each
  read that is one whole chunk line while the stream waits for more bytes
  (nothing unread before it): a token the lane takes costs a parse and the
  lane's call, inside the read's callback, and wakes no task. Anything
  else (a lane that refuses, partial or several lines, the end, an error)
  is kept and read by the stream as usual, so chunks stay in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import httptools

from gateway.upstream.http_client import HttpWorkerClient, decode_chunk_lines
from gateway.upstream.port import ChunkLane, WorkerAPI, WorkerRejected, WorkerUnreachable, rejected_error
from gateway.upstream.wire import encode_generate, offer_line
from workers.protocol import (
    AbortResponse,
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

_PAUSE_BYTES = 1 << 20  # stop reading a worker that is this far ahead of its consumer


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = self._timer_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._wait_s = 0.0
        # Offered each body read while the reader waits (set around its `wait`); True: taken.
        self.lane: Callable[[bytes], bool] | None = None
        self.begin()

    def begin(self) -> None:
        """Forget the previous response (call before sending a request)."""
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = True
        self.framed = False  # content-length or chunked: the end is in the bytes, not the close
        self.received = 0
        self.error: BaseException | None = None
        self.lane_error: Exception | None = None  # the lane raised: the stream fails with it
        self._body: list[bytes] = []
        self._buffered = 0

    @property
    def usable(self) -> bool:
        return self.transport is not None and self.error is None and not self.transport.is_closing()

    # -- asyncio.Protocol -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = exc
            self.close()
        if self._buffered > _PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        if self._body or self.lane is None or self.complete or self.error is not None or self.lane_error:
            self._wake()  # something for the reader (a lane that took the read leaves it asleep)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.headers_done and not self.complete and not self.framed and exc is None:
            self.complete = True  # a body delimited by the close itself
        elif not self.complete and self.error is None:
            self.error = exc or ConnectionResetError("the worker closed the connection")
        self._wake()

    # -- httptools callbacks ------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        lane = self.lane
        if lane is not None and not self._body:
            try:
                if lane(body):
                    self._deadline = self._loop.time() + self._wait_s  # bytes came: the read timeout starts again
                    return
            except Exception as exc:  # noqa: BLE001  # the stream raises it once its wait ends
                self.lane, self.lane_error = None, exc
                return
        self._body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- the caller's side ----------------------------------------------------------
    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def take(self) -> bytes:
        """The body bytes received so far (and not taken yet)."""
        body = self._body
        if not body:
            return b""
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def wait(self, timeout_s: float) -> asyncio.Future[None]:
        """A future done at more bytes, the end of the response, or the connection's
        loss; failed with TimeoutError after `timeout_s`. Await it at once.

        A plain method returning the future: no coroutine frame a read. The
        timeout is a deadline checked by one timer per connection, armed
        when none is due by then and re-armed when it fires early: a stream
        waits once per read, and a timer made and cancelled per read was ~5 %
        of the gateway's CPU relaying long streams (bench gateway, py-spy)."""
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        self._wait_s = timeout_s
        self._deadline = deadline = loop.time() + timeout_s
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = loop.call_at(deadline, self._check_deadline)
        return waiter

    def _check_deadline(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no read waits now: the next wait arms the timer again
        if self._loop.time() >= self._deadline:
            self._waiter = None
            waiter.set_exception(TimeoutError())
        else:
            self._timer_at = self._deadline
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # not cancelled with its reader
                waiter.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Target:
    """Where one worker URL's generate calls go, and its idle connections."""

    def __init__(self, url: str, auth: bytes) -> None:
        parts = urlsplit(url)
        self.url = url
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        path = parts.path.rstrip("/") + "/internal/generate"
        self.head = (
            f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-type: application/json\r\n".encode()
            + auth
            + b"content-length: "
        )
        self.idle: list[_Connection] = []


class RawWorkerClient:
    """`WorkerAPI`: generate / generate_stream here, the control calls via `control`."""

    def __init__(
        self,
        *,
        cluster_token: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 300.0,
        max_connections: int = 1024,
        control: WorkerAPI | None = None,
    ) -> None:
        if connect_timeout_s <= 0 or read_timeout_s <= 0 or max_connections < 1:
            raise ValueError("timeouts must be > 0 and max_connections >= 1")
        self._control: WorkerAPI = control or HttpWorkerClient(
            cluster_token=cluster_token,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            max_connections=max_connections,
        )
        self._auth = f"authorization: Bearer {cluster_token}\r\n".encode() if cluster_token else b""
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_idle = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._targets: dict[str, _Target] = {}
        self._tls: ssl.SSLContext | None = None

    # -- connections --------------------------------------------------------------
    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _Target(url, self._auth)
        return target

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        if target.tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop), target.host, target.port, ssl=self._tls if target.tls else None
                ),
                self._connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise WorkerUnreachable(f"{target.url}: connect failed: {type(exc).__name__}: {exc}") from exc
        return conn

    def _release(self, target: _Target, conn: _Connection) -> None:
        if conn.complete and conn.keep_alive and conn.usable and len(target.idle) < self._max_idle:
            target.idle.append(conn)
        else:
            conn.close()

    async def _open(self, target: _Target, body: bytes) -> _Connection:
        """Send the request; return once the status line and headers are in."""
        request = target.head + b"%d\r\n\r\n" % len(body) + body
        for attempt in (0, 1):
            conn = None
            while target.idle and attempt == 0:
                candidate = target.idle.pop()
                if candidate.usable:
                    conn = candidate
                    break
            reused = conn is not None
            if conn is None:
                conn = await self._connect(target)
            conn.begin()
            conn.send(request)
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(self._read_timeout_s)
                return conn
            except TimeoutError as exc:
                conn.close()
                raise WorkerUnreachable(f"{target.url}: no answer in {self._read_timeout_s:g} s") from exc
            except Exception as exc:
                conn.close()
                if reused and conn.received == 0:
                    continue  # the worker closed an idle connection as we sent: once more, fresh
                raise WorkerUnreachable(f"{target.url}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    async def _more(self, target: _Target, conn: _Connection) -> None:
        if conn.error is not None:
            raise WorkerUnreachable(f"{target.url}: stream broke: {type(conn.error).__name__}: {conn.error}")
        try:
            await conn.wait(self._read_timeout_s)
        except TimeoutError as exc:
            raise WorkerUnreachable(f"{target.url}: nothing for {self._read_timeout_s:g} s") from exc

    async def _read_rest(self, target: _Target, conn: _Connection) -> bytes:
        parts = []
        while True:
            parts.append(conn.take())
            if conn.complete:
                return b"".join(parts)
            await self._more(target, conn)

    # -- WorkerAPI ------------------------------------------------------------------
    async def generate_stream(
        self, url: str, req: GenerateRequest, *, lane: ChunkLane | None = None
    ) -> AsyncIterator[GenerateChunk]:
        target = self._target(url)
        offer = None if lane is None else offer_line(lane)
        async with self._slots:
            conn = await self._open(target, encode_generate(req, stream=True))
            try:
                if conn.status >= 400:
                    raise rejected_error(conn.status, await self._read_rest(target, conn))
                pending = b""
                while True:
                    data = conn.take()
                    if data:
                        pending = pending + data if pending else data
                        *lines, pending = pending.split(b"\n")
                        for chunk in decode_chunk_lines(lines):
                            if chunk.finish_reason is not None:
                                # To the end of the body *before* handing out the last chunk (the
                                # consumer may stop at it): then the connection can be reused.
                                with contextlib.suppress(WorkerUnreachable):
                                    await self._read_rest(target, conn)
                                yield chunk
                                return
                            yield chunk
                        continue
                    if conn.complete:
                        break
                    # `_more`, inline: one coroutine less per read of a long stream
                    if conn.error is not None:
                        raise WorkerUnreachable(f"{url}: stream broke: {type(conn.error).__name__}: {conn.error}")
                    conn.lane = None if pending else offer  # a partial line is read here, in order
                    try:
                        await conn.wait(self._read_timeout_s)
                    except TimeoutError as exc:
                        raise WorkerUnreachable(f"{url}: nothing for {self._read_timeout_s:g} s") from exc
                    finally:
                        conn.lane = None
                    if conn.lane_error is not None:
                        raise conn.lane_error
                if pending.strip():
                    chunk = decode_chunk_lines([pending])[0]
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
                raise WorkerUnreachable(f"{url}: stream ended without a final chunk")
            finally:
                self._release(target, conn)

    async def generate(self, url: str, req: GenerateRequest) -> GenerateChunk:
        target = self._target(url)
        async with self._slots:
            conn = await self._open(target, encode_generate(req, stream=False))
            try:
                body = await self._read_rest(target, conn)
            finally:
                self._release(target, conn)
        if conn.status >= 400:
            raise rejected_error(conn.status, body)
        chunks = decode_chunk_lines([body])
        if not chunks:
            raise WorkerRejected(f"{url}: empty answer", status=502, retryable=False)
        return chunks[0]

    async def abort(self, url: str, request_id: str) -> AbortResponse:
        return await self._control.abort(url, request_id)

    async def migrate(self, url: str, req: MigrateRequest) -> MigrateResponse:
        return await self._control.migrate(url, req)

    async def phase(self, url: str) -> PhaseStatus:
        return await self._control.phase(url)

    async def change_phase(self, url: str, req: PhaseChangeRequest, *, timeout_s: float) -> PhaseChangeResult:
        return await self._control.change_phase(url, req, timeout_s=timeout_s)

    async def stats(self, url: str, since: int = 0) -> WorkerStats:
        return await self._control.stats(url, since)

    async def fence(self, url: str, term: int) -> FenceStatus:
        return await self._control.fence(url, term)

    async def ready(self, url: str) -> bool:
        return await self._control.ready(url)

    async def aclose(self) -> None:
        for target in self._targets.values():
            for conn in target.idle:
                conn.close()
            target.idle.clear()
        await self._control.aclose()


__all__ = ["RawWorkerClient"]
