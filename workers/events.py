"""Block events from the KV connector to the worker's HTTP process.

vLLM runs the connector's scheduler side in its EngineCore child process; it
alone assigns host-store slots, so it alone knows where a request's blocks
were saved. It publishes small JSON datagrams on a Unix socket:

    {"type": "saved", "rid": "<request id>", "blocks": [[hash, slot], ...], "external_tokens": n}
    {"type": "dropped", "blocks": [[hash, slot], ...]}
    {"type": "iteration", "uncached_prompt_tokens": n, "cached_prompt_tokens": n, "elapsed_ms": x, ...}

Iteration events come from the connector's worker half, which times each
forward pass where it runs (vLLM's own `elapsed_ms` starts after the step was
dispatched, so it undercounts short steps).

This process listens, keeps saved/dropped blocks for the next stats call
(the gateway publishes them to the directory) and lets a finishing request
wait for its own "saved" event. Block data never travels here.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, channel: "KVEventChannel") -> None:
        self.channel = channel

    def datagram_received(self, data: bytes, addr) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return  # a malformed datagram is not ours to crash on
        self.channel.handle(event)


class KVEventChannel:
    def __init__(self, path: str, on_iteration=None) -> None:
        self.path = path
        self.on_iteration = on_iteration  # called with each "iteration" event
        self._transport: asyncio.DatagramTransport | None = None
        self._saved: dict[str, dict] = {}
        self._waiters: dict[str, asyncio.Future] = {}
        self.pending_saved: list[tuple[str, int]] = []
        self.pending_dropped: list[tuple[str, int]] = []

    async def start(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(self.path)
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

    def handle(self, event: dict) -> None:
        blocks = [(str(h), int(s)) for h, s in event.get("blocks", [])]
        if event.get("type") == "saved":
            self.pending_saved.extend(blocks)
            rid = str(event.get("rid", ""))
            event["blocks"] = blocks
            waiter = self._waiters.pop(rid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event)
            else:
                self._saved[rid] = event
                if len(self._saved) > 10_000:  # nobody waits for old ones
                    self._saved.pop(next(iter(self._saved)))
        elif event.get("type") == "dropped":
            self.pending_dropped.extend(blocks)
        elif event.get("type") == "iteration" and self.on_iteration is not None:
            self.on_iteration(event)

    async def wait_saved(self, rid: str, timeout: float) -> dict | None:
        if rid in self._saved:
            return self._saved.pop(rid)
        fut = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            self._waiters.pop(rid, None)

    def drain(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        saved, dropped = self.pending_saved, self.pending_dropped
        self.pending_saved, self.pending_dropped = [], []
        return saved, dropped


def publish(path: str, event: dict) -> None:
    """Send one event (from the connector's process). Never raises."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(json.dumps(event).encode(), path)
    except OSError:
        pass  # the worker's HTTP side is gone or busy; the directory is best-effort
