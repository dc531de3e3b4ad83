"""FakeTransport: in-process BlockTransport over a shared `FakeFabric` (tests).

Same contract as the NIXL transport: data then tags, same errors, the same
quarantine of timed-out reads. The fabric can kill nodes, cut their links
(reads to them hang until the link is restored, and then land late, as over
TCP), fail or stall reads, and run a hook between the data and tag copies
(to simulate a peer reusing a slot mid-read).
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
    cut: set[str] = field(default_factory=set)  # links down: reads hang, then land late
    polls_to_complete: int = 0  # polls a read stays PENDING before copying
    fail_reads: int = 0  # the next N reads end in TransferError
    between_data_and_tags: Callable[[str, list[int]], None] | None = None  # (peer, remote_slots)
    reads: int = 0

    def kill(self, node_id: str) -> None:
        self.dead.add(node_id)

    def cut_link(self, node_id: str) -> None:
        self.cut.add(node_id)

    def restore_link(self, node_id: str) -> None:
        self.cut.discard(node_id)


def _copy(fabric: FakeFabric, peer: str, dst: HostBlockStore, remote: list[int], local: list[int]) -> None:
    src = fabric.stores[peer]
    dst.data[local] = src.data[remote]
    if fabric.between_data_and_tags is not None:
        fabric.between_data_and_tags(peer, list(remote))
    dst.tags[local] = src.tags[remote]


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
            self._t._down[self._peer] = "disconnected"
            return self._fail(PeerUnavailable(f"peer {self._peer} disconnected"))
        if time.monotonic() > self._deadline:
            return self._fail(self._t._quarantine(self._peer, self._remote, self._local))
        if self._peer in fabric.cut:
            return self._state
        if self._polls_left > 0:
            self._polls_left -= 1
            return self._state
        if fabric.fail_reads > 0:
            fabric.fail_reads -= 1
            return self._fail(TransferError(f"injected failure reading from {self._peer}"))
        _copy(fabric, self._peer, self._t.store, self._remote, self._local)
        self._state = TransferState.DONE
        return self._state

    def wait(self, timeout_s: float | None = None) -> None:
        if timeout_s is not None:
            self._deadline = min(self._deadline, time.monotonic() + timeout_s)
        while self.poll() is TransferState.PENDING:
            time.sleep(0.0005)
        if self._error is not None:
            raise self._error


class FakeTransport:
    """BlockTransport over a FakeFabric; see kvpool.transport.base."""

    def __init__(self, node_id: str, store: HostBlockStore, fabric: FakeFabric, timeout_s: float = 5.0) -> None:
        self.node_id, self.store, self.fabric, self.timeout_s = node_id, store, fabric, timeout_s
        self._peers: dict[str, PeerLayout] = {}
        self._down: dict[str, str] = {}
        self._stuck: list[tuple[str, list[int], list[int]]] = []  # (peer, remote, local) timed out
        self._freed: list[int] = []
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
        if self.quarantined(node_id):
            raise PeerUnavailable(f"reads from {node_id} that timed out are still in flight")
        self._peers[node_id] = layout
        self._down.pop(node_id, None)

    def remove_peer(self, node_id: str) -> None:
        self._peers.pop(node_id, None)
        self._down.pop(node_id, None)

    def peers(self) -> list[str]:
        return sorted(n for n in self._peers if n not in self._down)

    def down_reason(self, node_id: str) -> str | None:
        return None if node_id not in self._peers else self._down.get(node_id, "")

    def _live(self, node_id: str) -> PeerLayout:
        layout = self._peers.get(node_id)
        if layout is None or node_id in self._down or node_id in self.fabric.dead or node_id not in self.fabric.stores:
            if layout is not None and node_id in self.fabric.dead:
                self._down[node_id] = "disconnected"
            raise PeerUnavailable(f"peer {node_id} is not available")
        return layout

    def read_blocks(self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int]) -> FakeHandle:
        layout = self._live(node_id)
        check_slots(remote_slots, local_slots, layout.capacity_blocks, self.store.capacity_blocks)
        self.fabric.reads += 1
        return FakeHandle(self, node_id, list(remote_slots), list(local_slots), time.monotonic() + self.timeout_s)

    def read_blocks_sync(
        self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int], timeout_s: float | None = None
    ) -> None:
        self.read_blocks(node_id, remote_slots, local_slots).wait(timeout_s)

    def probe(self, node_id: str, timeout_s: float) -> None:
        self._live(node_id)
        end = time.monotonic() + timeout_s
        while node_id in self.fabric.cut:
            if time.monotonic() > end:
                raise self._quarantine(node_id, [], [])
            time.sleep(0.0005)

    def quarantined(self, node_id: str | None = None) -> int:
        self._poll_stuck()
        return sum(1 for peer, _, _ in self._stuck if node_id is None or peer == node_id)

    def drain_quarantine(self) -> list[int]:
        self._poll_stuck()
        out, self._freed = self._freed, []
        return out

    def progress(self) -> None:
        self._poll_stuck()

    def close(self) -> None:
        self.fabric.stores.pop(self.node_id, None)

    def _quarantine(self, peer: str, remote: list[int], local: list[int]) -> TransferTimeout:
        self._down[peer] = "timed out"
        self._stuck.append((peer, remote, local))
        return TransferTimeout(f"read from {peer} timed out; {len(local)} slots quarantined")

    def _poll_stuck(self) -> None:
        keep = []
        for peer, remote, local in self._stuck:
            if peer in self.fabric.cut:
                keep.append((peer, remote, local))
                continue
            if peer not in self.fabric.dead and peer in self.fabric.stores and local:
                _copy(self.fabric, peer, self.store, remote, local)  # the late write TCP delivers
            self._freed.extend(local)
        self._stuck = keep
