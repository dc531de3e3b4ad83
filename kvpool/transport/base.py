"""Block transport contract: read blocks from a peer's host store into ours.

Errors (one hierarchy, drawn here):

    TransferError            any failed read; the local slots hold garbage
    ├── PeerUnavailable      peer unknown, dead, disconnected or still draining
    │                        stuck reads (retry elsewhere, or later)
    └── TransferTimeout      no completion before the deadline

A read moves the data of `remote_slots` into `local_slots` (pairwise), then
the tags of the same slots (see kvpool.store): after DONE the caller commits
the local slots with `HostBlockStore.commit(slots, verify=True)`, which
rejects blocks the peer evicted or overwrote during the read. With RDMA or
CMA reads are one-sided; over TCP UCX emulates them and the peer's progress
thread serves each one.

Quarantine. A read that timed out cannot be cancelled: over TCP the network
may still deliver its data into the local slots seconds later (when a pulled
cable is plugged back in). So a timed-out read keeps its slots: they are
*quarantined* until the transport sees the request finish (done, or failed
once UCX gives the connection up), and `drain_quarantine()` hands them back.
The caller must not write or reuse quarantined slots before that. The peer
is marked down at the timeout: reads to it raise PeerUnavailable until
`add_peer` again, which is refused while it still has quarantined reads.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class TransferError(Exception):
    """A block read failed; the destination slots must be aborted."""


class PeerUnavailable(TransferError):
    """The peer is unknown, dead or disconnected."""


class TransferTimeout(TransferError):
    """The read did not finish before its deadline; its local slots are
    quarantined (see the module doc) and the peer is marked down."""


class TransferState(str, Enum):
    PENDING = "pending"
    DONE = "done"
    ERROR = "error"


# PENDING may end in DONE or ERROR; both are terminal.
TRANSFER_TRANSITIONS: dict[TransferState, frozenset[TransferState]] = {
    TransferState.PENDING: frozenset({TransferState.PENDING, TransferState.DONE, TransferState.ERROR}),
    TransferState.DONE: frozenset({TransferState.DONE}),
    TransferState.ERROR: frozenset({TransferState.ERROR}),
}


class TransferHandle(Protocol):
    """One in-flight read. Not shared between threads."""

    def poll(self) -> TransferState:
        """Advance the read without blocking; past the deadline -> ERROR."""

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until DONE (returns) or ERROR (raises its TransferError).
        Raises TransferTimeout after timeout_s (default: the handle's deadline)."""

    @property
    def error(self) -> TransferError | None:
        """Why it failed, once ERROR."""


class BlockTransport(Protocol):
    """Moves whole blocks between host stores of equal block_bytes.

    Owner: one per worker process, bound to that worker's HostBlockStore.
    `read_blocks` may be called from any thread; each handle is used by the
    thread that created it. `progress` must be called regularly (or the
    transport's own background pump enabled) so peers can connect to us.
    """

    node_id: str

    def local_descriptor(self) -> bytes:
        """Opaque bytes a peer passes to add_peer (node id, layout, agent metadata)."""

    def add_peer(self, node_id: str, descriptor: bytes) -> None:
        """Learn (or refresh after a restart or a link failure) how to read
        the peer's store; replaces an earlier entry (a fresh connection).
        Raises ValueError when its block layout differs from ours and
        PeerUnavailable while reads to it are still quarantined."""

    def remove_peer(self, node_id: str) -> None: ...

    def peers(self) -> list[str]:
        """Peers reads may go to now (known and not marked down)."""

    def probe(self, node_id: str, timeout_s: float) -> None:
        """A minimal read from the peer (one tag into a private buffer): returns
        when the peer answered, raises like a read otherwise. For health checks."""

    def quarantined(self, node_id: str | None = None) -> int:
        """Timed-out reads (to this peer, or to any) not yet finished."""

    def drain_quarantine(self) -> list[int]:
        """Local slots of timed-out reads that have now finished: safe to reuse."""

    def read_blocks(self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int]) -> TransferHandle:
        """Start reading remote_slots[i] into local_slots[i]. Never blocks on
        the peer. Raises PeerUnavailable at once for unknown/dead peers and
        ValueError for slot lists of unequal length or out of range."""

    def read_blocks_sync(
        self,
        node_id: str,
        remote_slots: Sequence[int],
        local_slots: Sequence[int],
        timeout_s: float | None = None,
    ) -> None:
        """read_blocks + wait."""

    def progress(self) -> None:
        """Serve the transport's background work (peer connection setup)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class PeerLayout:
    """What a peer's descriptor says about its store."""

    node_id: str
    block_bytes: int
    capacity_blocks: int
    base_addr: int  # address of the store buffer in the peer's process
    tags_offset: int  # bytes from base_addr to tag 0


_HEADER = struct.Struct("<4sHQQQQH")  # magic, version, block_bytes, capacity, base, tags_off, len(node_id)
_MAGIC = b"KVPT"


def encode_descriptor(layout: PeerLayout, payload: bytes) -> bytes:
    node = layout.node_id.encode()
    head = _HEADER.pack(
        _MAGIC, 1, layout.block_bytes, layout.capacity_blocks, layout.base_addr, layout.tags_offset, len(node)
    )
    return head + node + payload


def decode_descriptor(descriptor: bytes) -> tuple[PeerLayout, bytes]:
    if len(descriptor) < _HEADER.size or descriptor[:4] != _MAGIC:
        raise ValueError("not a kvpool transport descriptor")
    magic, ver, bb, cap, base, toff, nlen = _HEADER.unpack_from(descriptor)
    if ver != 1:
        raise ValueError(f"unsupported descriptor version {ver}")
    node = descriptor[_HEADER.size : _HEADER.size + nlen].decode()
    return PeerLayout(node, bb, cap, base, toff), descriptor[_HEADER.size + nlen :]


def contiguous_runs(remote_slots: Sequence[int], local_slots: Sequence[int]) -> list[tuple[int, int, int]]:
    """Merge pairwise slots into runs (remote_start, local_start, count) where
    both sides advance by one slot; order of the input is kept."""
    runs: list[tuple[int, int, int]] = []
    for r, loc in zip(remote_slots, local_slots, strict=False):
        if runs:
            r0, l0, n = runs[-1]
            if r == r0 + n and loc == l0 + n:
                runs[-1] = (r0, l0, n + 1)
                continue
        runs.append((r, loc, 1))
    return runs


def check_slots(
    remote_slots: Sequence[int], local_slots: Sequence[int], remote_capacity: int, local_capacity: int
) -> None:
    if len(remote_slots) != len(local_slots):
        raise ValueError(f"{len(remote_slots)} remote slots but {len(local_slots)} local slots")
    for s in remote_slots:
        if not 0 <= s < remote_capacity:
            raise ValueError(f"remote slot {s} outside [0, {remote_capacity})")
    for s in local_slots:
        if not 0 <= s < local_capacity:
            raise ValueError(f"local slot {s} outside [0, {local_capacity})")
    if len(set(local_slots)) != len(local_slots):
        raise ValueError("duplicate local slots")
