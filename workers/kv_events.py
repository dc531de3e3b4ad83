"""The worker's end of the KV connector's event socket (`kvpool.events`).

The connector (in vLLM's EngineCore and model-runner processes) sends typed
events; this process listens, keeps saved/dropped blocks for the next stats
call (the gateway publishes them to the directory), hands step timings to
the iteration log, and lets a finishing request wait for its own
`BlocksSaved`, and counts the connector's pulls per peer (for the stats).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

from kvpool.events import (
    Block,
    BlocksDropped,
    BlocksSaved,
    EventDecodeError,
    KVEvent,
    PeerChanged,
    PullDone,
    StepTimed,
    decode,
)
from workers.protocol import KVPeerStats

log = logging.getLogger(__name__)
MAX_UNCLAIMED_SAVES = 10_000  # saved events nobody waited for (a request that ended otherwise)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, channel: KVEventChannel) -> None:
        self.channel = channel

    def datagram_received(self, data: bytes, addr: object) -> None:
        try:
            event = decode(data)
        except EventDecodeError as exc:
            log.warning("ignored a malformed KV event: %s", exc)  # not ours to crash on
            return
        self.channel.handle(event)


class KVEventChannel:
    def __init__(
        self,
        path: str,
        on_step: Callable[[StepTimed], None] | None = None,
        on_pull: Callable[[PullDone], None] | None = None,
    ) -> None:
        self.path = path
        self.on_step = on_step
        self.on_pull = on_pull  # each pull, as it ends (the request's trace gets a span)
        self._transport: asyncio.DatagramTransport | None = None
        self._saved: dict[str, BlocksSaved] = {}
        self._waiters: dict[str, asyncio.Future[BlocksSaved]] = {}
        self.pending_saved: list[Block] = []
        self.pending_dropped: list[Block] = []
        self._peers: dict[str, KVPeerStats] = {}

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

    def handle(self, event: KVEvent) -> None:
        if isinstance(event, BlocksSaved):
            self.pending_saved.extend(event.blocks)
            waiter = self._waiters.pop(event.rid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event)
            else:
                self._saved[event.rid] = event
                if len(self._saved) > MAX_UNCLAIMED_SAVES:
                    self._saved.pop(next(iter(self._saved)))
        elif isinstance(event, BlocksDropped):
            self.pending_dropped.extend(event.blocks)
        elif isinstance(event, PullDone):
            peer = self._peer(event.peer)
            peer.pulls[event.outcome] = peer.pulls.get(event.outcome, 0) + 1
            if event.outcome == "ok":
                peer.blocks += event.block_count
                peer.pull_seconds += event.seconds
            if self.on_pull is not None:
                self.on_pull(event)
        elif isinstance(event, PeerChanged):
            peer = self._peer(event.peer)
            if event.state == "down" and peer.state != "down":
                peer.downs += 1
            peer.state, peer.reason = event.state, event.reason or peer.reason
        elif self.on_step is not None:
            self.on_step(event)

    def _peer(self, node_id: str) -> KVPeerStats:
        if node_id not in self._peers:
            self._peers[node_id] = KVPeerStats(peer=node_id)
        return self._peers[node_id]

    def peer_stats(self) -> list[KVPeerStats]:
        """Pull counters per peer (copies, sorted by peer)."""
        return [self._peers[n].model_copy(deep=True) for n in sorted(self._peers)]

    async def wait_saved(self, rid: str, timeout: float) -> BlocksSaved | None:
        if rid in self._saved:
            return self._saved.pop(rid)
        fut: asyncio.Future[BlocksSaved] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return None
        finally:
            self._waiters.pop(rid, None)

    def drain(self) -> tuple[list[Block], list[Block]]:
        saved, dropped = self.pending_saved, self.pending_dropped
        self.pending_saved, self.pending_dropped = [], []
        return saved, dropped
