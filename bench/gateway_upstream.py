"""The upstream of `bench gateway`: one cheap process that every path shares.

A raw `asyncio.Protocol` with the `httptools` request parser on uvloop, on
one port, so the upstream costs ~20 µs of CPU per request and is never what
a proxy in front of it is measured by (the FastAPI fake worker costs ~1.4 ms,
which made "direct" slow and every ratio to it flattering):

    POST /v1/chat/completions, /v1/completions   OpenAI SSE (stream) or JSON, for direct
                                                 and the peers (vllm-router, smg)
    POST /internal/generate                      the worker protocol (NDJSON GenerateChunk
                                                 lines, or one JSON chunk), for our gateway
    POST /internal/abort                         AbortResponse
    GET  /internal/stats, /internal/phase        WorkerStats / PhaseStatus (gateway heartbeat)
    GET  /health /healthz /readyz /v1/models     readiness probes of every caller

Every generating route emits the same `max_tokens` tokens (default 16) with
no delay; `--token-interval-ms` > 0 paces the streams of at least
`--pace-from-tokens` tokens (default 0: every stream): one token per write,
all paced streams written together on one shared tick every interval, the
way a decode batch steps (one timer for all of them, so 256 paced streams
cost the upstream one wake-up a tick, not 256). The first token goes out at
once, the next at the following tick. Responses go out in one write
otherwise. A streamed OpenAI answer ends with a usage chunk when the
request asks for it (`stream_options.include_usage`). Bodies over
256 KiB are not JSON-parsed (request id and max_tokens are read from their
head and tail), so a 3.5 MB prompt never stalls the upstream in the stall
case. Keep-alive and pipelining are supported.

Generated token ids are drawn from `--vocab`'s range or, given
`--token-ids-file`, from that list (`bench gateway` passes the ids whose text
is whole on its own: see `gateway_bench.whole_token_ids`).

Run: `python -m bench.gateway_upstream --port P [--vocab 800 | --token-ids-file F] [--token-interval-ms 0
[--pace-from-tokens N]]`.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httptools
import orjson

_BIG = 256 * 1024
_OK = b"200 OK"


@dataclass
class UpstreamConfig:
    model: str = "bench"
    vocab: tuple[int, int] = (10, 800)  # token ids drawn from [lo, hi)
    token_ids: tuple[int, ...] = ()  # ... or from these, when given (`--token-ids-file`)
    block_size: int = 32
    token_interval_s: float = 0.0
    pace_from_tokens: int = 0  # with token_interval_s > 0: pace streams of at least this many tokens
    counters: dict[str, int] = field(default_factory=lambda: {"requests": 0, "connections": 0})


def tokens_for(seed: int, n: int, vocab: tuple[int, int], ids: Sequence[int] = ()) -> list[int]:
    """`n` deterministic token ids (same for every path): drawn from `ids`
    when given, else from the vocabulary range [lo, hi)."""
    pool = ids or range(*vocab)
    out, last = [], seed
    for i in range(n):
        last = (last * 31 + i * 17) % len(pool)
        out.append(pool[last])
    return out


class _Pacer:
    """Writes the next part of every paced stream once a tick (a fixed
    schedule: tick k at start + k * interval, so the interval does not drift
    with the time the writes take); the timer runs only while streams do."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.streams: list[tuple[_Conn, Iterator[bytes], bool]] = []
        self._next = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, conn: _Conn, parts: list[bytes], keep_alive: bool) -> None:
        it = iter(parts)
        if conn.transport is not None:
            conn.transport.write(next(it))
        self.streams.append((conn, it, keep_alive))
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._next = loop.time() + self.interval_s
            self._timer = loop.call_at(self._next, self._tick)

    def _tick(self) -> None:
        current, self.streams = self.streams, []  # a stream added while this tick writes starts next tick
        for conn, it, keep_alive in current:
            part = next(it, None)
            t = conn.transport
            if t is None:
                continue  # the client went away: drop the rest
            if part is not None:
                t.write(part)
                self.streams.append((conn, it, keep_alive))
                continue
            if not keep_alive:
                t.close()
            conn.stream_done()
        if not self.streams:
            self._timer = None
            return
        loop = asyncio.get_running_loop()
        self._next = max(self._next + self.interval_s, loop.time())
        self._timer = loop.call_at(self._next, self._tick)


class _Conn(asyncio.Protocol):
    def __init__(self, cfg: UpstreamConfig, pacer: _Pacer | None = None) -> None:
        self.cfg = cfg
        self.pacer = pacer
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.busy = False  # a paced stream is being written: answer pipelined requests after it
        self.queue: list[tuple[bytes, bytes, bytes, bool]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self.cfg.counters["connections"] += 1

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(b"400 Bad Request", b"text/plain", b"bad request", keep_alive=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        req = (
            self.parser.get_method(),
            self.url.split(b"?", 1)[0],
            b"".join(self.body),
            self.parser.should_keep_alive(),
        )
        if self.busy:
            self.queue.append(req)
        else:
            self._handle(*req)

    # -- answers ------------------------------------------------------------------
    def _send(self, status: bytes, ctype: bytes, body: bytes, *, keep_alive: bool) -> None:
        t = self.transport
        if t is None:
            return
        close = b"" if keep_alive else b"connection: close\r\n"
        t.write(
            b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
            % (status, ctype, len(body), close, body)
        )
        if not keep_alive:
            t.close()

    def _stream(self, ctype: bytes, frames: list[bytes], keep_alive: bool, tokens: int, lead: int = 0) -> None:
        """`frames` as one chunked body: `lead` frames before the `tokens` token
        frames, any after them (usage, [DONE]); paced, one write per token with
        the lead going out with the first and the tail with the last."""
        head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n%s\r\n" % (
            ctype,
            b"" if keep_alive else b"connection: close\r\n",
        )
        chunks = [b"%x\r\n%s\r\n" % (len(f), f) for f in frames]
        if self.pacer is None or tokens < max(2, self.cfg.pace_from_tokens):
            if self.transport is not None:
                self.transport.write(head + b"".join(chunks) + b"0\r\n\r\n")
                if not keep_alive:
                    self.transport.close()
            return
        last = lead + tokens - 1
        parts = [head + b"".join(chunks[: lead + 1]), *chunks[lead + 1 : last], b"".join(chunks[last:]) + b"0\r\n\r\n"]
        self.busy = True
        self.pacer.add(self, parts, keep_alive)

    def stream_done(self) -> None:
        """The pacer wrote a stream's last part: answer what was pipelined behind it."""
        self.busy = False
        if self.queue:
            self._handle(*self.queue.pop(0))

    def _handle(self, method: bytes, path: bytes, body: bytes, keep_alive: bool) -> None:
        cfg = self.cfg
        cfg.counters["requests"] += 1
        js = b"application/json"
        if method == b"POST":
            if path == b"/internal/generate":
                return self._generate(body, keep_alive)
            if path in (b"/v1/chat/completions", b"/v1/completions"):
                return self._openai(body, keep_alive, chat=path == b"/v1/chat/completions")
            if path == b"/internal/abort":
                rid = orjson.loads(body).get("request_id", "")
                return self._send(_OK, js, orjson.dumps({"request_id": rid, "aborted": False}), keep_alive=keep_alive)
        elif path == b"/internal/stats":
            stats = {
                "node_id": "up0",
                "phase": "decode",
                "num_running": 0,
                "num_waiting": 0,
                "kv_usage": 0.0,
                "block_size": cfg.block_size,
            }
            return self._send(_OK, js, orjson.dumps(stats), keep_alive=keep_alive)
        elif path == b"/internal/phase":
            return self._send(_OK, js, b'{"node_id":"up0","phase":"decode"}', keep_alive=keep_alive)
        elif path == b"/v1/models":
            models = {"object": "list", "data": [{"id": cfg.model, "object": "model", "created": 0, "owned_by": "b"}]}
            return self._send(_OK, js, orjson.dumps(models), keep_alive=keep_alive)
        elif path in (b"/health", b"/healthz", b"/readyz", b"/liveness", b"/readiness"):
            return self._send(_OK, js, b'{"status":"ok"}', keep_alive=keep_alive)
        elif path == b"/debug/counters":
            return self._send(_OK, js, orjson.dumps(cfg.counters), keep_alive=keep_alive)
        self._send(b"404 Not Found", js, b'{"error":"not found"}', keep_alive=keep_alive)

    def _generate(self, body: bytes, keep_alive: bool) -> None:
        if len(body) > _BIG:  # a huge prompt: read what we need without parsing it
            head, tail = body[:512], body[-1024:]
            m = re.search(rb'"request_id":\s*"([^"]+)"', head) or re.search(rb'"request_id":\s*"([^"]+)"', tail)
            rid = m.group(1).decode() if m else "unknown"
            mt = re.search(rb'"max_tokens":\s*(\d+)', tail) or re.search(rb'"max_tokens":\s*(\d+)', head)
            n = int(mt.group(1)) if mt else 16
            stream = re.search(rb'"stream":\s*false', body[:512] + body[-1024:]) is None
            prefill = b'"role":"prefill"' in head + tail
            prompt_len = body.count(b",", 0, body.find(b"]")) + 1
        else:
            req = orjson.loads(body)
            rid, n = req["request_id"], int(req.get("sampling", {}).get("max_tokens", 16))
            stream, prefill = req.get("stream", True), req.get("role") == "prefill"
            prompt_len = len(req["prompt_token_ids"])
        toks = tokens_for(prompt_len, 1 if prefill else n, self.cfg.vocab, self.cfg.token_ids)
        if not stream:
            chunk = {"request_id": rid, "token_ids": toks, "finish_reason": "length", "prompt_tokens": prompt_len}
            return self._send(_OK, b"application/json", orjson.dumps(chunk), keep_alive=keep_alive)
        head = b'{"request_id":%s,"prompt_tokens":%d,"token_ids":[' % (orjson.dumps(rid), prompt_len)
        frames = [head + b"%d]}\n" % t for t in toks[:-1]]
        frames.append(head + b'%d],"finish_reason":"length"}\n' % toks[-1])
        self._stream(b"application/x-ndjson", frames, keep_alive, len(toks))

    def _openai(self, body: bytes, keep_alive: bool, *, chat: bool) -> None:
        if len(body) > _BIG:
            tail = body[-1024:]
            m = re.search(rb'"max(?:_completion)?_tokens":\s*(\d+)', tail)
            req: dict[str, Any] = {
                "max_tokens": int(m.group(1)) if m else 16,
                "stream": re.search(rb'"stream":\s*true', tail) is not None,
            }
        else:
            req = orjson.loads(body)
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        cfg = self.cfg
        created = int(time.time())
        rid = b"up-%d" % cfg.counters["requests"]
        model = orjson.dumps(cfg.model)
        text = b" tok" * n
        usage = b'"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}' % (n, n + 1)
        if not req.get("stream"):
            if chat:
                choice = b'{"index":0,"finish_reason":"length","message":{"role":"assistant","content":"%s"}}' % text
                obj = b"chat.completion"
            else:
                choice = b'{"index":0,"finish_reason":"length","text":"%s"}' % text
                obj = b"text_completion"
            out = b'{"id":"%s","object":"%s","created":%d,"model":%s,"choices":[%s],%s}' % (
                rid,
                obj,
                created,
                model,
                choice,
                usage,
            )
            return self._send(_OK, b"application/json", out, keep_alive=keep_alive)
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        head = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[{"index":0,' % (
            rid,
            obj,
            created,
            model,
        )
        frames = [head + b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'] if chat else []
        part = b'"delta":{"content":" tok"}' if chat else b'"text":" tok"'
        for i in range(n):
            frames.append(head + part + b',"finish_reason":%s}]}\n\n' % (b'"length"' if i == n - 1 else b"null"))
        if (req.get("stream_options") or {}).get("include_usage"):
            frames.append(head.removesuffix(b'[{"index":0,') + b"[]," + usage + b"}\n\n")
        frames.append(b"data: [DONE]\n\n")
        self._stream(b"text/event-stream", frames, keep_alive, n, lead=1 if chat else 0)


async def serve(cfg: UpstreamConfig, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    pacer = _Pacer(cfg.token_interval_s) if cfg.token_interval_s > 0 else None
    server = await loop.create_server(lambda: _Conn(cfg, pacer), host, port, backlog=2048, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_upstream", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="bench")
    p.add_argument("--vocab", type=int, default=800, help="token ids are drawn from [10, vocab)")
    p.add_argument("--token-ids-file", help="a JSON list of the token ids to draw from (instead of --vocab's range)")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--token-interval-ms", type=float, default=0.0)
    p.add_argument("--pace-from-tokens", type=int, default=0, help="pace only streams of at least this many tokens")
    args = p.parse_args(argv)
    import uvloop

    ids = tuple(orjson.loads(pathlib.Path(args.token_ids_file).read_bytes())) if args.token_ids_file else ()
    cfg = UpstreamConfig(
        args.model,
        (10, args.vocab),
        ids,
        args.block_size,
        args.token_interval_ms / 1000,
        args.pace_from_tokens,
    )
    uvloop.run(serve(cfg, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
