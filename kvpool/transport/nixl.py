"""NIXL BlockTransport: one-sided READs of peers' host stores over UCX.

Why it looks like this (measured with nixl 1.5.1 on CPU-only hosts):
- The agent runs without NIXL's progress thread: that thread busy-spins a
  core and halved throughput on a 2-core machine. Initiators drive their
  reads by polling `check_xfer_state`.
- The *target* must still make progress while a new peer connects (UCX
  wire-up); afterwards reads are one-sided (CMA / RDMA) and need nothing from
  it. A light pump thread (`progress_interval_s`) or the owner's own calls to
  `progress()` cover that.
- Each read posts one request per phase with one descriptor per contiguous
  run of slots, so batches of neighbouring blocks move as one large copy.
- A dead peer surfaces as nixlRemoteDisconnectError at post or poll time:
  mapped to PeerUnavailable, the peer is marked dead until add_peer again.
The agent is not thread-safe in this mode: one lock serialises every call.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.hashing import HASH_BYTES
from kvpool.store import HostBlockStore
from kvpool.transport.base import (
    PeerLayout,
    PeerUnavailable,
    TransferError,
    TransferState,
    TransferTimeout,
    check_slots,
    contiguous_runs,
    decode_descriptor,
    encode_descriptor,
)


def _nixl() -> tuple[Any, Any, tuple[type[Exception], ...], type[Exception]]:
    """Import NIXL lazily (importing it is slow and pulls CUDA probing)."""
    import sys

    from nixl._api import nixl_agent, nixl_agent_config

    bindings = sys.modules[nixl_agent.__module__.rsplit(".", 1)[0] + "._bindings"]
    errors = tuple(getattr(bindings, n) for n in dir(bindings) if n.startswith("nixl") and n.endswith("Error"))
    return nixl_agent, nixl_agent_config, errors, bindings.nixlRemoteDisconnectError


@dataclass(frozen=True)
class NixlTransportConfig:
    timeout_s: float = 10.0  # default deadline of one read (> 0)
    progress_interval_s: float | None = 0.002  # background pump period; None: call progress()
    backend: str = "UCX"

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or (self.progress_interval_s is not None and self.progress_interval_s <= 0):
            raise ValueError(f"invalid NixlTransportConfig {self}")


@dataclass
class _Peer:
    layout: PeerLayout
    agent_name: str
    dead: bool = False


class NixlHandle:
    """A read in two phases (data, then tags); see TransferHandle."""

    def __init__(self, transport: NixlTransport, peer: str, runs: list[tuple[int, int, int]], deadline: float) -> None:
        self._t, self._peer, self._runs, self._deadline = transport, peer, runs, deadline
        self._phase = 0
        self._xfer: Any = None
        self._state = TransferState.PENDING
        self._error: TransferError | None = None
        self._xfer = transport._post(peer, runs, tags=False)

    @property
    def error(self) -> TransferError | None:
        return self._error

    def poll(self) -> TransferState:
        if self._state is not TransferState.PENDING:
            return self._state
        try:
            status = self._t._check(self._peer, self._xfer)
            if status == "DONE":
                self._t._release(self._xfer)
                self._xfer = None
                if self._phase == 1:
                    self._state = TransferState.DONE
                    return self._state
                self._phase = 1
                self._xfer = self._t._post(self._peer, self._runs, tags=True)
                return self.poll()
            if status == "ERR":
                raise TransferError(f"read from {self._peer} failed")
            if time.monotonic() > self._deadline:
                raise TransferTimeout(f"read from {self._peer} timed out")
        except TransferError as err:
            self._state, self._error = TransferState.ERROR, err
            if self._xfer is not None:
                self._t._release(self._xfer)
                self._xfer = None
        return self._state

    def wait(self, timeout_s: float | None = None) -> None:
        if timeout_s is not None:
            self._deadline = min(self._deadline, time.monotonic() + timeout_s)
        start = time.monotonic()
        while self.poll() is TransferState.PENDING:
            # Spin briefly (small reads finish in microseconds), then back off.
            time.sleep(0 if time.monotonic() - start < 0.002 else 0.0002)
        if self._error is not None:
            raise self._error


class NixlTransport:
    """BlockTransport over NIXL; see kvpool.transport.base for the contract."""

    def __init__(self, node_id: str, store: HostBlockStore, config: NixlTransportConfig | None = None) -> None:
        nixl_agent, nixl_agent_config, self._nixl_errors, self._disconnect = _nixl()
        self.node_id, self.store = node_id, store
        self.config = config or NixlTransportConfig()
        self._lock = threading.RLock()
        self._agent_name = f"{node_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._agent = nixl_agent(
            self._agent_name,
            nixl_agent_config(enable_prog_thread=False, backends=[self.config.backend]),
        )
        buf = store.buffer
        self._base = buf.data_ptr()
        self._reg = self._agent.register_memory([(self._base, buf.numel(), 0, "")], "DRAM")
        self._peers: dict[str, _Peer] = {}
        self._stop = threading.Event()
        self._pump: threading.Thread | None = None
        if self.config.progress_interval_s is not None:
            self._pump = threading.Thread(target=self._pump_loop, name=f"nixl-pump-{node_id}", daemon=True)
            self._pump.start()

    # -- peers ---------------------------------------------------------
    def local_descriptor(self) -> bytes:
        layout = PeerLayout(
            self.node_id, self.store.block_bytes, self.store.capacity_blocks, self._base, self.store.tags_offset
        )
        with self._lock:
            return encode_descriptor(layout, self._agent.get_agent_metadata())

    def add_peer(self, node_id: str, descriptor: bytes) -> None:
        layout, metadata = decode_descriptor(descriptor)
        if layout.node_id != node_id:
            raise ValueError(f"descriptor is for {layout.node_id!r}, not {node_id!r}")
        if layout.block_bytes != self.store.block_bytes:
            raise ValueError(f"peer {node_id} blocks are {layout.block_bytes} B, ours {self.store.block_bytes} B")
        self.remove_peer(node_id)
        with self._lock:
            name = self._agent.add_remote_agent(metadata)
        self._peers[node_id] = _Peer(layout, name.decode() if isinstance(name, bytes) else name)

    def remove_peer(self, node_id: str) -> None:
        peer = self._peers.pop(node_id, None)
        if peer is not None:
            with self._lock:
                try:
                    self._agent.remove_remote_agent(peer.agent_name)
                except self._nixl_errors:
                    pass  # already gone on NIXL's side; nothing left to release

    def peers(self) -> list[str]:
        return sorted(n for n, p in self._peers.items() if not p.dead)

    # -- reads ---------------------------------------------------------
    def read_blocks(self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int]) -> NixlHandle:
        peer = self._peers.get(node_id)
        if peer is None or peer.dead:
            raise PeerUnavailable(f"peer {node_id} is {'dead' if peer else 'unknown'}")
        check_slots(remote_slots, local_slots, peer.layout.capacity_blocks, self.store.capacity_blocks)
        runs = contiguous_runs(remote_slots, local_slots)
        return NixlHandle(self, node_id, runs, time.monotonic() + self.config.timeout_s)

    def read_blocks_sync(
        self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int], timeout_s: float | None = None
    ) -> None:
        self.read_blocks(node_id, remote_slots, local_slots).wait(timeout_s)

    def progress(self) -> None:
        with self._lock:
            self._agent.get_new_notifs()

    def close(self) -> None:
        self._stop.set()
        if self._pump is not None:
            self._pump.join(timeout=1.0)
        for node_id in list(self._peers):
            self.remove_peer(node_id)
        with self._lock:
            self._agent.deregister_memory(self._reg)

    # -- internals used by NixlHandle -------------------------------------
    def _post(self, node_id: str, runs: list[tuple[int, int, int]], *, tags: bool) -> Any:
        peer = self._peers[node_id]
        if tags:
            unit, rbase = HASH_BYTES, peer.layout.base_addr + peer.layout.tags_offset
            lbase = self._base + self.store.tags_offset
        else:
            unit, rbase, lbase = self.store.block_bytes, peer.layout.base_addr, self._base
        local = [(lbase + loc * unit, n * unit, 0) for _, loc, n in runs]
        remote = [(rbase + r * unit, n * unit, 0) for r, _, n in runs]
        with self._lock:
            try:
                handle = self._agent.initialize_xfer(
                    "READ",
                    self._agent.get_xfer_descs(local, "DRAM"),
                    self._agent.get_xfer_descs(remote, "DRAM"),
                    peer.agent_name,
                )
                try:
                    status = self._agent.transfer(handle)
                except self._nixl_errors:
                    self._agent.release_xfer_handle(handle)
                    raise
            except self._nixl_errors as err:
                raise self._translate(node_id, err) from err
        if status == "ERR":
            self._release(handle)
            raise TransferError(f"posting a read from {node_id} failed")
        return handle

    def _check(self, node_id: str, handle: Any) -> str:
        with self._lock:
            try:
                return str(self._agent.check_xfer_state(handle))
            except self._nixl_errors as err:
                raise self._translate(node_id, err) from err

    def _release(self, handle: Any) -> None:
        with self._lock:
            try:
                self._agent.release_xfer_handle(handle)
            except self._nixl_errors:
                pass  # NIXL could not cancel it; the agent frees it at teardown

    def _translate(self, node_id: str, err: Exception) -> TransferError:
        if isinstance(err, self._disconnect):
            peer = self._peers.get(node_id)
            if peer is not None:
                peer.dead = True
            return PeerUnavailable(f"peer {node_id} disconnected: {err}")
        return TransferError(f"read from {node_id} failed: {type(err).__name__}: {err}")

    def _pump_loop(self) -> None:
        assert self.config.progress_interval_s is not None
        while not self._stop.wait(self.config.progress_interval_s):
            self.progress()
