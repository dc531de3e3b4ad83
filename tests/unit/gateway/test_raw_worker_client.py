"""`RawWorkerClient` over real sockets on localhost: against the fake worker
(same answers as the httpx client) and against a scripted HTTP server for
the failure contract (refused, idle timeout, cut streams, stale keep-alive
connections, early close, bad lines)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import pytest

from core import Phase
from gateway.upstream.http_client import HttpWorkerClient
from gateway.upstream.port import WorkerRejected, WorkerUnreachable
from gateway.upstream.raw_client import RawWorkerClient
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.stacks import serve
from workers.protocol import GenerateRequest, SamplingOptions


def request(rid: str = "r1", n: int = 5) -> GenerateRequest:
    return GenerateRequest(request_id=rid, prompt_token_ids=list(range(10, 30)), sampling=SamplingOptions(max_tokens=n))


async def tokens_of(client: RawWorkerClient | HttpWorkerClient, url: str, req: GenerateRequest) -> list[int]:
    out: list[int] = []
    async for chunk in client.generate_stream(url, req):
        out += chunk.token_ids
    return out


async def test_same_answers_as_the_httpx_client_over_the_fake_worker() -> None:
    worker = FakeWorker("w0", phase=Phase.DECODE, token_range=(10, 500))
    raw, httpx_client = RawWorkerClient(), HttpWorkerClient()
    try:
        async with serve(create_fake_worker_app(worker)) as url:
            for i in range(3):  # reused connections give the same answers
                req = request(f"s{i}", n=7)
                assert await tokens_of(raw, url, req) == await tokens_of(httpx_client, url, req)
            one = request("g1", n=1)
            assert (await raw.generate(url, one)).token_ids == (await httpx_client.generate(url, one)).token_ids
            assert (await raw.stats(url)).node_id == "w0"  # control calls go through httpx
    finally:
        await raw.aclose()
        await httpx_client.aclose()


# -- a scripted server ----------------------------------------------------------------
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Script:
    """Each accepted connection runs `handler(reader, writer, index)`; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open = 0
        self.max_open = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            await self.handler(reader, writer, index)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open -= 1
            writer.close()


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[tuple[str, Script]]:
    script = Script(handler)
    server = await asyncio.start_server(script._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", script
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> dict:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
    return json.loads(await reader.readexactly(length))


def ndjson_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def line(rid: str, tokens: list[int], finish: str | None = None) -> bytes:
    body = {"request_id": rid, "token_ids": tokens, **({"finish_reason": finish} if finish else {})}
    return json.dumps(body).encode() + b"\n"


async def answer_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    req = await read_request(reader)
    rid = req["request_id"]
    body = chunk(line(rid, [1]) + line(rid, [2])) + chunk(line(rid, [3], "length"))
    writer.write(ndjson_head() + body + b"0\r\n\r\n")
    await writer.drain()


async def test_one_keep_alive_connection_serves_sequential_calls() -> None:
    async def handler(reader, writer, index):
        while True:
            await answer_stream(reader, writer)

    client = RawWorkerClient()
    async with scripted(handler) as (url, script):
        for i in range(5):
            assert await tokens_of(client, url, request(f"k{i}")) == [1, 2, 3]
        assert script.connections == 1
    await client.aclose()


async def test_nothing_listening_is_unreachable_and_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = RawWorkerClient()
    with pytest.raises(WorkerUnreachable) as err:
        await tokens_of(client, f"http://127.0.0.1:{port}", request())
    assert err.value.refused
    await client.aclose()


async def test_a_worker_that_goes_quiet_times_out_as_unreachable_not_refused() -> None:
    async def handler(reader, writer, index):
        req = await read_request(reader)
        writer.write(ndjson_head() + chunk(line(req["request_id"], [1])))
        await asyncio.sleep(30)

    client = RawWorkerClient(read_timeout_s=0.2)
    async with scripted(handler) as (url, _):
        got: list[int] = []
        with pytest.raises(WorkerUnreachable, match="nothing for 0.2 s") as err:
            async for c in client.generate_stream(url, request()):
                got += c.token_ids
        assert got == [1] and not err.value.refused
    await client.aclose()


async def test_the_read_timeout_is_per_read_not_per_stream() -> None:
    """Chunks 0.08 s apart for 0.64 s under a 0.2 s timeout: the one deadline
    timer fires mid-stream, finds a read since, and waits again; reads a
    stream's lane took count as reads."""

    async def handler(reader, writer, index):
        req = await read_request(reader)
        writer.write(ndjson_head())
        for t in range(8):
            await asyncio.sleep(0.08)
            writer.write(chunk(line(req["request_id"], [t], "length" if t == 7 else None)))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    client = RawWorkerClient(read_timeout_s=0.2)
    async with scripted(handler) as (url, _):
        assert await tokens_of(client, url, request(n=8)) == list(range(8))
        assert await tokens_of(client, url, request("r2", n=8)) == list(range(8))  # a pooled connection, same
        log = await laned(client, url, request("r3", n=8), Taker([]))
        assert [t for _, ts in log for t in ts] == list(range(8)) and log[-1] == ("yield", [7])
        assert sum(s == "lane" for s, _ in log) >= 6
    await client.aclose()


async def test_a_stream_cut_before_its_final_chunk_is_unreachable() -> None:
    async def handler(reader, writer, index):
        req = await read_request(reader)
        writer.write(ndjson_head() + chunk(line(req["request_id"], [1])) + b"0\r\n\r\n")
        await writer.drain()

    client = RawWorkerClient()
    async with scripted(handler) as (url, _):
        with pytest.raises(WorkerUnreachable, match="without a final chunk"):
            await tokens_of(client, url, request())
    await client.aclose()


async def test_a_stale_keep_alive_connection_is_retried_once_on_a_fresh_one() -> None:
    async def handler(reader, writer, index):
        await answer_stream(reader, writer)
        if index == 0:
            await reader.readuntil(b"\r\n\r\n")  # the second request arrives: close without answering
            return
        while True:
            await answer_stream(reader, writer)

    client = RawWorkerClient()
    async with scripted(handler) as (url, script):
        assert await tokens_of(client, url, request("a")) == [1, 2, 3]
        assert await tokens_of(client, url, request("b")) == [1, 2, 3]
        assert script.connections == 2
    await client.aclose()


async def test_a_stream_closed_early_does_not_return_its_connection() -> None:
    release = asyncio.Event()

    async def handler(reader, writer, index):
        req = await read_request(reader)
        writer.write(ndjson_head() + chunk(line(req["request_id"], [1])))
        await writer.drain()
        await release.wait()

    client = RawWorkerClient()
    async with scripted(handler) as (url, script):
        for rid in ("a", "b"):
            stream = client.generate_stream(url, request(rid))
            assert isinstance(stream, AsyncGenerator)  # an async generator: it can be closed early
            assert (await stream.__anext__()).token_ids == [1]
            await stream.aclose()  # the client left: this connection cannot be reused
        assert script.connections == 2
        release.set()
    await client.aclose()


async def test_error_answers_and_bad_lines_are_rejections() -> None:
    async def handler(reader, writer, index):
        req = await read_request(reader)
        if req["request_id"] == "busy":
            body = json.dumps({"error": {"type": "draining", "message": "switching", "retryable": True}}).encode()
            writer.write(b"HTTP/1.1 503 x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        else:
            writer.write(ndjson_head() + chunk(b'{"request_id": "bad", "token_ids": "x"}\n') + b"0\r\n\r\n")
        await writer.drain()

    client = RawWorkerClient()
    async with scripted(handler) as (url, _):
        with pytest.raises(WorkerRejected) as busy:
            await tokens_of(client, url, request("busy"))
        assert busy.value.retryable and busy.value.status_code == 503
        with pytest.raises(WorkerRejected) as bad:
            await tokens_of(client, url, request("garbled"))
        assert not bad.value.retryable and bad.value.status_code == 502
    await client.aclose()


async def test_a_close_delimited_answer_to_generate_is_complete() -> None:
    async def handler(reader, writer, index):
        req = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + line(req["request_id"], [8], "length"))
        await writer.drain()

    client = RawWorkerClient()
    async with scripted(handler) as (url, _):
        chunk_ = await client.generate(url, request("p", n=1))
        assert chunk_.token_ids == [8]
    await client.aclose()


async def test_calls_beyond_max_connections_wait_for_a_slot() -> None:
    async def handler(reader, writer, index):
        while True:
            req = await read_request(reader)
            await asyncio.sleep(0.05)
            writer.write(ndjson_head() + chunk(line(req["request_id"], [1], "stop")) + b"0\r\n\r\n")
            await writer.drain()

    client = RawWorkerClient(max_connections=2)
    async with scripted(handler) as (url, script):
        results = await asyncio.gather(*(tokens_of(client, url, request(f"c{i}")) for i in range(5)))
        assert results == [[1]] * 5
        assert script.max_open <= 2
    await client.aclose()


def test_every_worker_api_call_is_served() -> None:
    # The raw client stands in for HttpWorkerClient wherever the gateway takes a WorkerAPI.
    from gateway.upstream.port import WorkerAPI

    wanted = {n for n in vars(WorkerAPI) if not n.startswith("_")}
    assert wanted and wanted <= {n for n in dir(RawWorkerClient) if not n.startswith("_")}
    assert "fence" in wanted


# -- the lane -------------------------------------------------------------------------
class Taker:
    """A `ChunkLane` logging what it takes into `log`; refuses the tokens in `refuse`."""

    def __init__(self, log: list[tuple[str, list[int]]], refuse: frozenset[int] = frozenset()) -> None:
        self.log, self.refuse = log, refuse

    def __call__(self, c) -> bool:
        if c.finish_reason is not None or set(c.token_ids) & self.refuse:
            return False
        self.log.append(("lane", list(c.token_ids)))
        return True


async def laned(client: RawWorkerClient, url: str, req: GenerateRequest, lane) -> list[tuple[str, list[int]]]:
    log = lane.log
    async for c in client.generate_stream(url, req, lane=lane):
        log.append(("yield", list(c.token_ids)))
    return log


async def test_a_lane_takes_whole_lines_while_the_stream_waits_and_order_holds() -> None:
    """One line a read goes to the lane; two lines in a read, a line split over
    two reads, a line the lane refuses and the final one are yielded, in order."""

    async def handler(reader, writer, index):
        while True:  # keep-alive: one request after the other
            rid = (await read_request(reader))["request_id"]
            half = line(rid, [4])
            reads = [
                chunk(line(rid, [1])),
                chunk(line(rid, [2]) + line(rid, [3])),
                chunk(half[:9]),
                chunk(half[9:]),
                chunk(line(rid, [5])),
                chunk(line(rid, [6])),
                chunk(line(rid, [7], "length")) + b"0\r\n\r\n",
            ]
            writer.write(ndjson_head())
            for data in reads:
                await asyncio.sleep(0.03)  # each its own read
                writer.write(data)
                await writer.drain()

    client = RawWorkerClient()
    async with scripted(handler) as (url, script):
        for rid in ("a", "b"):  # the second on the pooled connection
            log = await laned(client, url, request(rid, n=7), Taker([], refuse=frozenset({5})))
            assert log == [
                ("lane", [1]),
                ("yield", [2, 3]),
                ("yield", [4]),
                ("yield", [5]),
                ("lane", [6]),
                ("yield", [7]),
            ]
        assert script.connections == 1
    await client.aclose()


async def test_a_lane_that_raises_fails_the_stream_with_its_error_and_the_connection_goes() -> None:
    async def handler(reader, writer, index):
        while True:
            rid = (await read_request(reader))["request_id"]
            writer.write(ndjson_head())
            for t in (1, 2, 3):
                await asyncio.sleep(0.03)
                writer.write(chunk(line(rid, [t], "length" if t == 3 else None)))
                await writer.drain()
            writer.write(b"0\r\n\r\n")

    def broken(c) -> bool:
        raise KeyError("lane bug")

    client = RawWorkerClient()
    async with scripted(handler) as (url, script):
        with pytest.raises(KeyError, match="lane bug"):
            async for _ in client.generate_stream(url, request("x", n=3), lane=broken):
                pass
        assert await tokens_of(client, url, request("y", n=3)) == [1, 2, 3]
        assert script.connections == 2  # the broken stream's connection was not reused
    await client.aclose()


async def test_a_bad_line_in_a_read_of_its_own_is_refused_by_the_lane_and_rejected() -> None:
    async def handler(reader, writer, index):
        await read_request(reader)
        writer.write(ndjson_head())
        await asyncio.sleep(0.03)
        writer.write(chunk(b'{"request_id": "bad", "token_ids": "x"}\n') + b"0\r\n\r\n")
        await writer.drain()

    client = RawWorkerClient()
    taker = Taker([])
    async with scripted(handler) as (url, _):
        with pytest.raises(WorkerRejected) as bad:
            await laned(client, url, request("garbled"), taker)
        assert bad.value.status_code == 502 and taker.log == []
    await client.aclose()
