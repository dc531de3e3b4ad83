"""NIXL BlockTransport: READs of peers' host stores over UCX.

Why it looks like this (nixl 1.5.1, UCX 1.23, CPU hosts; measured in
docs/benchmarks-history.md):
- Descriptor lists are prepared once: ours (data slots, then tag slots, then
  a private probe tag) at construction, each peer's when it is added. A read
  is `makeXferReq(indices)` on the prepared lists, one request per phase
  (data, then tags) whatever the slots' layout; NIXL merges neighbours.
- On one host UCX reads with CMA and finishes inside `postXferReq`: the
  synchronous path then makes no status call at all. Across hosts over TCP,
  UCX emulates a READ with messages the *peer's* CPU answers, so every agent
  runs NIXL's progress thread, event driven: it sleeps in poll() on the UCX
  worker's fd (`progress_delay_us` is that poll's timeout). NIXL's Python
  API hard-codes a 0 ms timeout, a busy spin (78 % of a core when idle), so
  the agent is built through the bindings here.
- A read that misses its deadline keeps its local slots in quarantine until
  NIXL sees it finish (kvpool.transport.base); the peer is marked down.
- A dead peer surfaces as nixlRemoteDisconnectError at post or poll time:
  PeerUnavailable, and the peer is marked down until `add_peer` again.
- `DEFAULT_UCX_ENV` goes into the environment (without overriding what the
  operator set) before the agent exists, because UCX reads it only then.
One lock serialises every agent call (the agent runs without NIXL's own
locking).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.hashing import HASH_BYTES
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

# Failure detection over TCP (set only when the environment does not):
# - CONN_NB: connecting to an unreachable peer returns at once instead of
#   blocking add_peer (and our lock) for 2-39 s;
# - USER_TIMEOUT + KEEPALIVE_INTERVAL: a pulled cable is otherwise never
#   reported (reads stay in progress for the kernel's ~15 min); with these UCX
#   closes the connection 4-6 s after the link dies, and a stuck read
#   finishes with an error, which ends its quarantine.
DEFAULT_UCX_ENV: dict[str, str] = {
    "UCX_TCP_CONN_NB": "y",
    "UCX_TCP_USER_TIMEOUT": "3s",
    "UCX_KEEPALIVE_INTERVAL": "1s",
}
PROGRESS_MODES = ("thread", "pump", "none")
_SPIN_S = 0.002  # spin on a read's status this long, then poll every _POLL_S
_POLL_S = 0.0002


def _bindings() -> Any:
    """NIXL's pybind module (import is slow and probes CUDA: done lazily)."""
    import sys

    from nixl._api import nixl_agent  # noqa: PLC2701 - NIXL exposes its bindings module through no public name

    return sys.modules[nixl_agent.__module__.rsplit(".", 1)[0] + "._bindings"]


@dataclass(frozen=True)
class NixlTransportConfig:
    timeout_s: float = 10.0  # default deadline of one read (> 0)
    # "thread": NIXL's progress thread, event driven; "pump": a Python thread
    # calling progress() every progress_interval_s; "none": the owner calls
    # progress() (a peer that never serves connection setup: tests).
    progress: str = "thread"
    progress_delay_us: int = 100_000  # thread: poll() timeout in µs (> 0)
    progress_interval_s: float = 0.002  # pump: period (> 0)
    backend: str = "UCX"
    ucx_env: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_UCX_ENV))

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.progress_delay_us <= 0 or self.progress_interval_s <= 0:
            raise ValueError(f"invalid NixlTransportConfig {self}")
        if self.progress not in PROGRESS_MODES:
            raise ValueError(f"progress must be one of {PROGRESS_MODES}, not {self.progress!r}")


@dataclass
class _Peer:
    node_id: str
    layout: PeerLayout
    agent_name: str
    dlist: int  # prepared: [0, cap) data slots, [cap, 2 cap) their tags
    down: str = ""  # why reads to it are refused ("" = up)


@dataclass
class _Stuck:
    """A timed-out request NIXL has not finished: its slots may still be written."""

    peer: _Peer
    handle: int
    slots: tuple[int, ...]


class NixlHandle:
    """A read in two phases (data, then tags); see TransferHandle."""

    def __init__(self, t: NixlTransport, peer: _Peer, idx: tuple[Any, ...], deadline: float) -> None:
        self._t, self._peer, self._idx, self._deadline = t, peer, idx, deadline
        self._phase = 0
        self._state = TransferState.PENDING
        self._error: TransferError | None = None
        self._h = 0
        if len(idx[0]) == 0:
            self._state = TransferState.DONE
            return
        self._h, st = t._post(peer, idx[0], idx[1])
        self._advance(st)

    @property
    def error(self) -> TransferError | None:
        return self._error

    def _advance(self, st: int) -> None:
        """Act on the current request's status (a finished one is released)."""
        t = self._t
        while st == t._OK:
            if self._phase == 1:
                self._state = TransferState.DONE
                return
            self._phase = 1
            try:
                self._h, st = t._post(self._peer, self._idx[2], self._idx[3])
            except TransferError as err:
                self._state, self._error = TransferState.ERROR, err
                return
        if st != t._IN_PROG:
            t._release(self._h)
            self._state = TransferState.ERROR
            self._error = TransferError(f"read from {self._peer.node_id} failed (status {st})")

    def poll(self) -> TransferState:
        if self._state is not TransferState.PENDING:
            return self._state
        t = self._t
        try:
            st = t._status(self._peer, self._h)
        except TransferError as err:
            self._state, self._error = TransferState.ERROR, err
            return self._state
        if st == t._IN_PROG:
            if time.monotonic() > self._deadline:
                self._state = TransferState.ERROR
                self._error = t._quarantine(self._peer, self._h, self._idx[0])
            return self._state
        if st == t._OK:
            t._release(self._h)
        self._advance(st)
        return self._state

    def wait(self, timeout_s: float | None = None) -> None:
        if timeout_s is not None:
            self._deadline = min(self._deadline, time.monotonic() + timeout_s)
        start = time.monotonic()
        while self.poll() is TransferState.PENDING:
            time.sleep(0 if time.monotonic() - start < _SPIN_S else _POLL_S)
        if self._error is not None:
            raise self._error


class NixlTransport:
    """BlockTransport over NIXL; see kvpool.transport.base for the contract."""

    def __init__(self, node_id: str, store: HostBlockStore, config: NixlTransportConfig | None = None) -> None:
        self.node_id, self.store = node_id, store
        self.config = cfg = config or NixlTransportConfig()
        for key, value in cfg.ucx_env.items():
            os.environ.setdefault(key, value)
        b = self._b = _bindings()
        self._OK, self._IN_PROG, self._READ = b.NIXL_SUCCESS, b.NIXL_IN_PROG, b.NIXL_READ
        self._errors = tuple(getattr(b, n) for n in dir(b) if n.startswith("nixl") and n.endswith("Error"))
        self._disconnect = b.nixlRemoteDisconnectError
        self._lock = threading.RLock()
        self.agent_name = f"{node_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        agent_cfg = b.nixlAgentConfig()
        agent_cfg.useProgThread = cfg.progress == "thread"
        agent_cfg.useListenThread = False
        agent_cfg.syncMode = b.NIXL_THREAD_SYNC_NONE
        agent_cfg.pthrDelay = cfg.progress_delay_us
        agent_cfg.lthrDelay = 100_000
        agent_cfg.captureTelemetry = False
        self._a = b.nixlAgent(self.agent_name, agent_cfg)
        self._a.createBackend(cfg.backend, {})
        buf = store.buffer
        self._base = buf.data_ptr()
        self._probe_buf = np.zeros(HASH_BYTES, dtype=np.uint8)  # a probe's destination, never a slot
        self._regs = [
            b.nixlRegDList(b.DRAM_SEG, [(self._base, buf.numel(), 0, "")]),
            b.nixlRegDList(b.DRAM_SEG, [(self._probe_buf.ctypes.data, HASH_BYTES, 0, "")]),
        ]
        for reg in self._regs:
            self._a.registerMem(reg, [])
        cap = store.capacity_blocks
        self._dlist = self._prep(
            b.NIXL_INIT_AGENT, self._base, store.block_bytes, cap, store.tags_offset, self._probe_buf.ctypes.data
        )
        self._probe_index = 2 * cap
        self._peers: dict[str, _Peer] = {}
        self._retiring: list[_Peer] = []  # removed while reads to them were stuck
        self._stuck: list[_Stuck] = []
        self._freed: list[int] = []
        self._stop = threading.Event()
        self._pump: threading.Thread | None = None
        if cfg.progress == "pump":
            self._pump = threading.Thread(target=self._pump_loop, name=f"nixl-pump-{node_id}", daemon=True)
            self._pump.start()

    # -- peers ---------------------------------------------------------
    def local_descriptor(self) -> bytes:
        layout = PeerLayout(
            self.node_id, self.store.block_bytes, self.store.capacity_blocks, self._base, self.store.tags_offset
        )
        with self._lock:
            return encode_descriptor(layout, self._a.getLocalMD())

    def add_peer(self, node_id: str, descriptor: bytes) -> None:
        layout, metadata = decode_descriptor(descriptor)
        if layout.node_id != node_id:
            raise ValueError(f"descriptor is for {layout.node_id!r}, not {node_id!r}")
        if layout.block_bytes != self.store.block_bytes:
            raise ValueError(f"peer {node_id} blocks are {layout.block_bytes} B, ours {self.store.block_bytes} B")
        if self.quarantined(node_id):
            raise PeerUnavailable(f"reads from {node_id} that timed out are still in flight")
        self.remove_peer(node_id)
        with self._lock:
            try:
                name = self._a.loadRemoteMD(metadata)
                name = name.decode() if isinstance(name, bytes) else str(name)
                dlist = self._prep(
                    name, layout.base_addr, layout.block_bytes, layout.capacity_blocks, layout.tags_offset
                )
            except self._errors as err:
                raise PeerUnavailable(f"adding peer {node_id} failed: {type(err).__name__}: {err}") from err
        self._peers[node_id] = _Peer(node_id, layout, name, dlist)

    def remove_peer(self, node_id: str) -> None:
        peer = self._peers.pop(node_id, None)
        if peer is None:
            return
        with self._lock:
            if any(s.peer is peer for s in self._stuck):
                peer.down = peer.down or "removed"
                self._retiring.append(peer)  # forgotten once its stuck reads finish
            else:
                self._forget(peer)

    def peers(self) -> list[str]:
        return sorted(n for n, p in self._peers.items() if not p.down)

    def down_reason(self, node_id: str) -> str | None:
        """Why reads to a known peer are refused ("" when up); None: unknown."""
        peer = self._peers.get(node_id)
        return None if peer is None else peer.down

    def probe(self, node_id: str, timeout_s: float) -> None:
        peer = self._live_peer(node_id)
        deadline = time.monotonic() + timeout_s
        h, st = self._post(peer, [self._probe_index], [peer.layout.capacity_blocks])
        self._finish(peer, h, st, deadline, ())

    def quarantined(self, node_id: str | None = None) -> int:
        with self._lock:
            self._poll_stuck()
            return sum(1 for s in self._stuck if node_id is None or s.peer.node_id == node_id)

    def drain_quarantine(self) -> list[int]:
        with self._lock:
            self._poll_stuck()
            out, self._freed = self._freed, []
            return out

    # -- reads ---------------------------------------------------------
    def read_blocks(self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int]) -> NixlHandle:
        peer = self._live_peer(node_id)
        idx = self._indices(peer, remote_slots, local_slots)
        return NixlHandle(self, peer, idx, time.monotonic() + self.config.timeout_s)

    def read_blocks_sync(
        self, node_id: str, remote_slots: Sequence[int], local_slots: Sequence[int], timeout_s: float | None = None
    ) -> None:
        """read_blocks + wait, straight-line: no handle object, and no status
        call at all when UCX completes inside post (CMA on one host). This is
        the pool's hot path: a 64 KiB read costs ~20 µs, of which the Python
        here was ~5 µs before it was trimmed (docs/benchmarks-history.md)."""
        peer = self._live_peer(node_id)
        lidx, ridx, ltag, rtag = self._indices(peer, remote_slots, local_slots)
        if len(lidx) == 0:
            return
        deadline = time.monotonic() + (self.config.timeout_s if timeout_s is None else timeout_s)
        ok = self._OK
        h, st = self._post(peer, lidx, ridx)
        if st != ok:
            self._finish(peer, h, st, deadline, lidx)
        h, st = self._post(peer, ltag, rtag)
        if st != ok:
            self._finish(peer, h, st, deadline, lidx)

    def progress(self) -> None:
        with self._lock:
            self._a.getNotifs({}, [])
            self._poll_stuck()

    def close(self) -> None:
        self._stop.set()
        if self._pump is not None:
            self._pump.join(timeout=1.0)
        with self._lock:
            for stuck in self._stuck:
                self._release(stuck.handle)
            self._stuck.clear()
            for peer in [*self._peers.values(), *self._retiring]:
                self._forget(peer)
            self._peers.clear()
            self._retiring.clear()
            self._release_dlist(self._dlist)
            for reg in self._regs:
                self._a.deregisterMem(reg, [])
            # Dropping the agent destroys its UCX worker: nothing lands in our memory after this.
            self._a = None

    # -- internals ---------------------------------------------------------
    def _prep(
        self, agent: str, base: int, block_bytes: int, cap: int, tags_offset: int, probe_addr: int | None = None
    ) -> int:
        """Prepare [data slot i | tag i | (probe)] descriptors for `agent`'s store."""
        rows = np.zeros((2 * cap + (probe_addr is not None), 3), dtype=np.uint64)
        rows[:cap, 0] = base + np.arange(cap, dtype=np.uint64) * np.uint64(block_bytes)
        rows[:cap, 1] = block_bytes
        rows[cap : 2 * cap, 0] = base + tags_offset + np.arange(cap, dtype=np.uint64) * np.uint64(HASH_BYTES)
        rows[cap : 2 * cap, 1] = HASH_BYTES
        if probe_addr is not None:
            rows[2 * cap] = (probe_addr, HASH_BYTES, 0)
        with self._lock:
            return int(self._a.prepXferDlist(agent, self._b.nixlXferDList(self._b.DRAM_SEG, rows), []))

    def _live_peer(self, node_id: str) -> _Peer:
        peer = self._peers.get(node_id)
        if peer is None or peer.down:
            raise PeerUnavailable(f"peer {node_id} is {peer.down if peer else 'unknown'}")
        return peer

    def _indices(self, peer: _Peer, remote_slots: Sequence[int], local_slots: Sequence[int]) -> tuple[Any, ...]:
        """(local data, remote data, local tags, remote tags) descriptor indices."""
        lcap, rcap = self.store.capacity_blocks, peer.layout.capacity_blocks
        if len(local_slots) == 1 == len(remote_slots):  # the common case, without check_slots' loops
            ls, rs = local_slots[0], remote_slots[0]
            if 0 <= ls < lcap and 0 <= rs < rcap:
                return [ls], [rs], [ls + lcap], [rs + rcap]
        if len(local_slots) <= 16:
            check_slots(remote_slots, local_slots, rcap, lcap)
            lidx, ridx = list(local_slots), list(remote_slots)
            return lidx, ridx, [s + lcap for s in lidx], [s + rcap for s in ridx]
        li, ri = np.asarray(local_slots, dtype=np.int32), np.asarray(remote_slots, dtype=np.int32)
        if li.shape != ri.shape:
            raise ValueError(f"{len(ri)} remote slots but {len(li)} local slots")
        if ri.min() < 0 or ri.max() >= rcap:
            raise ValueError(f"a remote slot is outside [0, {rcap})")
        if li.min() < 0 or li.max() >= lcap:
            raise ValueError(f"a local slot is outside [0, {lcap})")
        if len(np.unique(li)) != len(li):
            raise ValueError("duplicate local slots")
        return li, ri, li + lcap, ri + rcap

    def _post(self, peer: _Peer, li: Any, ri: Any) -> tuple[int, int]:
        """Make and post one READ; returns (handle, status). A request that
        finished inside post is released here (the handle is then stale)."""
        a = self._a
        with self._lock:
            try:
                h = a.makeXferReq(self._READ, self._dlist, li, peer.dlist, ri, b"", [], False)
            except self._errors as err:
                raise self._translate(peer, err) from err
            try:
                st = a.postXferReq(h, b"")
            except self._errors as err:
                self._release(h)
                raise self._translate(peer, err) from err
            if st == self._OK:
                a.releaseXferReq(h)
        return h, st

    def _finish(self, peer: _Peer, h: int, st: int, deadline: float, slots: Any) -> None:
        """Wait for a posted request (already released when st is OK)."""
        if st == self._OK:
            return
        start = time.monotonic()
        while st == self._IN_PROG:
            now = time.monotonic()
            if now > deadline:
                raise self._quarantine(peer, h, slots)
            time.sleep(0 if now - start < _SPIN_S else _POLL_S)
            st = self._status(peer, h)
        self._release(h)
        if st != self._OK:
            raise TransferError(f"read from {peer.node_id} failed (status {st})")

    def _status(self, peer: _Peer, h: int) -> int:
        with self._lock:
            try:
                return int(self._a.getXferStatus(h))
            except self._errors as err:
                self._release(h)
                raise self._translate(peer, err) from err

    def _release(self, h: int) -> None:
        # NIXL could not cancel it: the agent frees it at teardown.
        with self._lock, contextlib.suppress(*self._errors):
            self._a.releaseXferReq(h)

    def _release_dlist(self, dlist: int) -> None:
        with contextlib.suppress(*self._errors):  # already gone with its agent
            self._a.releasedDlistH(dlist)

    def _forget(self, peer: _Peer) -> None:
        """Drop NIXL's side of a peer (lock held; no stuck reads to it)."""
        self._release_dlist(peer.dlist)
        with contextlib.suppress(*self._errors):  # already gone on NIXL's side; nothing left to release
            self._a.invalidateRemoteMD(peer.agent_name)

    def _quarantine(self, peer: _Peer, h: int, slots: Any) -> TransferTimeout:
        with self._lock:
            peer.down = "timed out"
            self._stuck.append(_Stuck(peer, h, tuple(int(s) for s in slots)))
        return TransferTimeout(f"read from {peer.node_id} timed out; {len(slots)} slots quarantined")

    def _poll_stuck(self) -> None:
        """Release stuck requests NIXL has finished (lock held)."""
        if not self._stuck:
            return
        keep: list[_Stuck] = []
        for s in self._stuck:
            try:
                st = int(self._a.getXferStatus(s.handle))
            except self._errors:
                st = -1  # disconnected: UCX finished it with an error
            if st == self._IN_PROG:
                keep.append(s)
                continue
            self._release(s.handle)
            self._freed.extend(s.slots)
        self._stuck = keep
        for peer in list(self._retiring):
            if not any(s.peer is peer for s in keep):
                self._retiring.remove(peer)
                self._forget(peer)

    def _translate(self, peer: _Peer, err: Exception) -> TransferError:
        if isinstance(err, self._disconnect):
            peer.down = "disconnected"
            return PeerUnavailable(f"peer {peer.node_id} disconnected: {err}")
        return TransferError(f"read from {peer.node_id} failed: {type(err).__name__}: {err}")

    def _pump_loop(self) -> None:
        while not self._stop.wait(self.config.progress_interval_s):
            self.progress()
