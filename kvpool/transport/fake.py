"""FakeTransport: in-process BlockTransport over a shared `FakeFabric` (tests).

Same contract as the NIXL transport: data then tags, same errors. The fabric
can kill nodes, fail or stall reads, and run a hook between the data and tag
copies (to simulate a peer reusing a slot mid-read).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvpool.store import HostBlockStore
from kvpool.transport.base import (
    PeerLayout,
    PeerUnavailable,
    TransferError,
    TransferState,
    TransferTimeout,
    check_slots,
    decode_descriptor,
    encode_descriptor,
)


@dataclass
class FakeFabric:
    """The 'network': node_id -> store, plus fault injection knobs."""

    stores: dict[str, HostBlockStore] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    polls_to_complete: int = 0  # polls a read stays PENDING before copying
    fail_reads: int = 0  # the next N reads end in TransferError
    between_data_and_tags: Callable[[str, list[int]], None] | None = None  # (peer, remote_slots)
    reads: int = 0

    def kill(self, node_id: str) -> None:
        self.dead.add(node_id)


class FakeHandle:
    def __init__(
        self, transport: FakeTransport, peer: str, remote: list[int], local: list[int], deadline: float
    ) -> None:
        self._t, self._peer, self._remote, self._local = transport, peer, remote, local
        self._deadline = deadline
        self._polls_left = transport.fabric.polls_to_complete
        self._state = TransferState.PENDING
        self._error: TransferError | None = None

    @property
    def error(self) -> TransferError | None:
        return self._error

    def _fail(self, err: TransferError) -> TransferState:
        self._state, self._error = TransferState.ERROR, err
        return self._state

    def poll(self) -> TransferState:
        if self._state is not TransferState.PENDING:
            return self._state
        fabric = self._t.fabric
        if self._peer in fabric.dead:
            return self._fail(PeerUnavailable(f"peer {self._peer} disconnected"))
        if time.monotonic() > self._deadline:
            return self._fail(TransferTimeout(f"read from {self._peer} timed out"))
        if self._polls_left > 0:
            self._polls_left -= 1
            return self._state
        if fabric.fail_reads > 0:
            fabric.fail_reads -= 1
            return self._fail(TransferError(f"injected failure reading from {self._peer}"))
        src, dst = fabric.stores[self._peer], self._t.store
        dst.data[self._local] = src.data[self._remote]
        if fabric.between_data_and_tags is not None:
            fabric.between_data_and_tags(self._peer, list(self._remote))
        dst.tags[self._local] = src.tags[self._remote]
        self._state = TransferState.DONE
        return self._state

    def wait(self, timeout_s: float | None = None) -> None:
        end = self._deadline if timeout_s is None else min(self._deadline, time.monotonic() + timeout_s)
        while self.poll() is TransferState.PENDING:
            if time.monotonic() > end:
                self._fail(TransferTimeout(f"read from {self._peer} timed out"))
                break
            time.sleep(0.0005)
        if self._error is not None:
            raise self._error


class FakeTransport:
    """BlockTransport over a FakeFabric; see kvpool.transport.base."""

    def __init__(self, node_id: str, store: HostBlockStore, fabric: FakeFabric, timeout_s: float = 5.0) -> None:
        self.node_id, self.store, self.fabric, self.timeout_s = node_id, store, fabric, timeout_s
        self._peers: dict[str, PeerLayout] = {}
        fabric.stores[node_id] = store
        fabric.dead.discard(node_id)

    def local_descriptor(self) -> bytes:
        layout = PeerLayout(self.node_id, self.store.block_bytes, self.store.capacity_blocks, 0, self.store.tags_offset)
        return encode_descriptor(layout, b"fake")

    def add_peer(self, node_id: str, descriptor: bytes) -> None:
        layout, _ = decode_descriptor(descriptor)
        if layout.node_id != node_id:
            raise ValueError(f"descriptor is for {layout.node_id!r}, not {node_id!r}")
        if layout.block_bytes != self.store.block_bytes:
            raise ValueError(f"peer {node_id} blocks are {layout.block_bytes} B, ours {self.store.block_bytes} B")
        self._peers[node_id] = layout

    def remove_peer(self, node_id: str) -> None:
        self._peers.pop(node_id, None)

    def peers(self) -> list[str]:
        return sorted(self._peers)

    def read_blocks(self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int]) -> FakeHandle:
        layout = self._peers.get(node_id)
        if layout is None or node_id in self.fabric.dead or node_id not in self.fabric.stores:
            raise PeerUnavailable(f"peer {node_id} is not available")
        check_slots(remote_slots, local_slots, layout.capacity_blocks, self.store.capacity_blocks)
        self.fabric.reads += 1
        return FakeHandle(self, node_id, list(remote_slots), list(local_slots), time.monotonic() + self.timeout_s)

    def read_blocks_sync(
        self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int], timeout_s: float | None = None
    ) -> None:
        self.read_blocks(node_id, remote_slots, local_slots).wait(timeout_s)

    def progress(self) -> None:
        return None

    def close(self) -> None:
        self.fabric.stores.pop(self.node_id, None)
