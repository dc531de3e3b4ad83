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
no delay; `--token-interval-ms` > 0 writes one token per write with that
pause between them. Responses go out in one write otherwise. Bodies over
256 KiB are not JSON-parsed (request id and max_tokens are read from their
head and tail), so a 3.5 MB prompt never stalls the upstream in the stall
case. Keep-alive and pipelining are supported.

Run: `python -m bench.gateway_upstream --port P [--vocab 800] [--token-interval-ms 0]`.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
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
    block_size: int = 32
    token_interval_s: float = 0.0
    counters: dict[str, int] = field(default_factory=lambda: {"requests": 0, "connections": 0})


def tokens_for(seed: int, n: int, vocab: tuple[int, int]) -> list[int]:
    """`n` deterministic token ids in the vocabulary (same for every path)."""
    lo, hi = vocab
    out, last = [], seed
    for i in range(n):
        last = lo + (last * 31 + i * 17) % (hi - lo)
        out.append(last)
    return out


class _Conn(asyncio.Protocol):
    def __init__(self, cfg: UpstreamConfig) -> None:
        self.cfg = cfg
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

    def _stream(self, ctype: bytes, frames: list[bytes], keep_alive: bool) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n%s\r\n" % (
            ctype,
            b"" if keep_alive else b"connection: close\r\n",
        )
        chunks = [b"%x\r\n%s\r\n" % (len(f), f) for f in frames]
        if self.cfg.token_interval_s <= 0:
            if self.transport is not None:
                self.transport.write(head + b"".join(chunks) + b"0\r\n\r\n")
                if not keep_alive:
                    self.transport.close()
            return
        self.busy = True
        asyncio.ensure_future(self._paced(head, chunks, keep_alive))

    async def _paced(self, head: bytes, chunks: list[bytes], keep_alive: bool) -> None:
        for i, part in enumerate([head + chunks[0], *chunks[1:], b"0\r\n\r\n"]):
            if i:
                await asyncio.sleep(self.cfg.token_interval_s)
            if self.transport is None:
                return
            self.transport.write(part)
        if not keep_alive and self.transport is not None:
            self.transport.close()
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
        toks = tokens_for(prompt_len, 1 if prefill else n, self.cfg.vocab)
        if not stream:
            chunk = {"request_id": rid, "token_ids": toks, "finish_reason": "length", "prompt_tokens": prompt_len}
            return self._send(_OK, b"application/json", orjson.dumps(chunk), keep_alive=keep_alive)
        head = b'{"request_id":%s,"prompt_tokens":%d,"token_ids":[' % (orjson.dumps(rid), prompt_len)
        frames = [head + b"%d]}\n" % t for t in toks[:-1]]
        frames.append(head + b'%d],"finish_reason":"length"}\n' % toks[-1])
        self._stream(b"application/x-ndjson", frames, keep_alive)

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
        frames.append(b"data: [DONE]\n\n")
        self._stream(b"text/event-stream", frames, keep_alive)


async def serve(cfg: UpstreamConfig, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(cfg), host, port, backlog=2048, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_upstream", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="bench")
    p.add_argument("--vocab", type=int, default=800, help="token ids are drawn from [10, vocab)")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--token-interval-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    import uvloop

    cfg = UpstreamConfig(args.model, (10, args.vocab), args.block_size, args.token_interval_ms / 1000)
    uvloop.run(serve(cfg, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
