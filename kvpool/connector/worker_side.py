"""Worker half of `PoolConnector`: bytes between vLLM's paged cache and the pool.

Runs in vLLM's model-runner process. Owns the host store buffer (one
`HostBlockStore` region: data slots + hash tags) registered with NIXL, and
does exactly what the scheduler half's `StepPlan` says:

- saves: device blocks -> host slots, synchronously in the next step (a
  memcpy; the blocks are held for us until we report them); a slot's tag
  is zero while its data changes (`fill_slots`), pulls into staging slots
  too, so a peer that still reads a reused slot under its old block finds
  it stale, never new data under the old hash;
- async loads: on a background thread, pull remote slots over NIXL into
  staging slots, verify their tags, copy host -> device, report the request
  in `finished_recving`;
- layerwise loads: pull during the step, copy each layer as the forward
  pass reaches it.

A failed load reports its device blocks as invalid; vLLM recomputes them.
A pull has a deadline (`pull_timeout_s`); its peer is then marked down and
later loads from it recompute at once until the recovery loop
(kvpool.connector.peers) has it answering again. The staging slots of a
read that timed out stay quarantined (the network may still write them):
`slot_notices()` reports them, and later their release, to the scheduler
half, which keeps them out of use meanwhile.

When: vLLM starts async loads after launching the forward pass, which on a
GPU overlaps them with it. On the CPU backend the forward pass is
synchronous, so "after the launch" means after the whole step: a finished
prefill's save, and with it the prefill's answer, would wait for the next
step's compute (a full prefill chunk on a busy prefill node), and a load
would start a step late. There the saves and loads run before the forward.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable

import httpx
import torch

from kvpool.agent_info import CLUSTER_TOKEN_ENV, AgentInfo
from kvpool.connector.peers import RECOVERY_INTERVAL_S, PeerLinks, failure_reason
from kvpool.events import PullDone, StepTimed, publish
from kvpool.hashing import hash_tag
from kvpool.plan import LoadItem, RemoteRead, StepPlan
from kvpool.store import HostBlockStore, StoreConfig
from kvpool.transport.base import BlockTransport, TransferError, TransferTimeout

log = logging.getLogger(__name__)

# Reads of a few blocks take milliseconds; a peer that has not answered in
# this long is dead or wedged, and every load queued behind it would wait too.
PULL_TIMEOUT_S = 3.0


class WorkerSide:
    def __init__(self, node_id: str, block_bytes: int, capacity: int, extra: dict) -> None:
        self.node_id, self.block_bytes, self.capacity = node_id, block_bytes, capacity
        self.run_dir = pathlib.Path(extra.get("run_dir", "data/run"))
        self.use_nixl = bool(extra.get("nixl", True))
        self.pull_timeout_s = float(extra.get("pull_timeout_s", PULL_TIMEOUT_S))
        if self.pull_timeout_s <= 0:
            raise ValueError(f"pull_timeout_s must be > 0, not {self.pull_timeout_s}")
        # The secret travels by environment, inherited from the worker
        # process, never in vLLM's config (which vLLM logs).
        self.cluster_token = os.environ.get(CLUSTER_TOKEN_ENV) or None
        self.layers: list[tuple[str, torch.Tensor, int]] = []  # (layer, u8 view [blocks, bytes], offset)
        self.store: HostBlockStore | None = None
        self.transport: BlockTransport | None = None
        self.links: PeerLinks | None = None
        self._quarantined: list[int] = []  # staging slots to report as quarantined / released
        self._released: list[int] = []
        self._stop = threading.Event()
        self._recovery: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kv-load")
        self._lock = threading.Lock()
        self._done_recv: set[str] = set()
        self._done_send: set[str] = set()
        self._errors: set[int] = set()
        self._layerwise: list[tuple[LoadItem, bool]] = []
        self.events_socket: str | None = extra.get("events_socket")
        self._step: tuple[float, dict] | None = None
        self._forward_end: float | None = None
        self.before_forward = False  # set in register(): transfers before the forward pass (CPU)

    # -- set-up --------------------------------------------------------------
    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        offset = 0
        for name, t in kv_caches.items():
            for view in _block_views(t):
                self.layers.append((name, view, offset))
                offset += view.shape[1]
        if offset != self.block_bytes:
            raise RuntimeError(f"KV layout is {offset} B per block, scheduler expects {self.block_bytes} B")
        self.before_forward = all(t.device.type == "cpu" for t in kv_caches.values())
        self.store = HostBlockStore(StoreConfig(block_bytes=self.block_bytes, capacity_blocks=self.capacity))
        info = AgentInfo(
            node_id=self.node_id,
            agent_name="",
            metadata_b64="",
            region_base=0,
            block_bytes=self.block_bytes,
            capacity_blocks=self.capacity,
        )
        if self.use_nixl:
            from kvpool.transport.nixl import NixlTransport, NixlTransportConfig

            nixl = NixlTransport(self.node_id, self.store, NixlTransportConfig(timeout_s=self.pull_timeout_s))
            self.attach(nixl)
            info = dataclasses.replace(
                info,
                agent_name=self.node_id,
                region_base=self.store.buffer.data_ptr(),
                metadata_b64=base64.b64encode(nixl.local_descriptor()).decode(),
            )
        info.write(self.run_dir)

    def attach(self, transport: BlockTransport) -> None:
        """Pull through `transport` (a BlockTransport over this side's store)
        and start the recovery loop."""
        self.transport = transport
        self.links = PeerLinks(
            transport, cluster_token=self.cluster_token, timeout_s=self.pull_timeout_s, events_socket=self.events_socket
        )
        self._recovery = threading.Thread(target=self._recovery_loop, name="kv-peer-recovery", daemon=True)
        self._recovery.start()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=False)
        if self._recovery is not None:
            self._recovery.join(timeout=5.0)
        if self.transport is not None:
            self.transport.close()

    def slot_notices(self) -> tuple[list[int], list[int]]:
        """(staging slots newly quarantined, slots whose quarantine ended) since
        the last call, for the scheduler half. Reported no later than the
        step that reports the load finished (quarantine happens first)."""
        with self._lock:
            out = (self._quarantined, self._released)
            self._quarantined, self._released = [], []
        return out

    def _recovery_loop(self) -> None:
        assert self.links is not None
        while not self._stop.wait(RECOVERY_INTERVAL_S):
            try:
                freed = self.links.heal()
            except Exception:
                log.exception("KV peer recovery round failed; trying again")
                continue
            if freed:
                with self._lock:
                    self._released.extend(freed)

    # -- per step ------------------------------------------------------------
    def begin_step(self, plan: StepPlan) -> None:
        """Right before the forward pass: the step's clock starts here."""
        self._step = (time.perf_counter(), plan.shape) if plan.shape else None
        if self.before_forward:
            self._transfer(plan)

    def start_step(self, plan: StepPlan) -> None:
        # Without layerwise loads vLLM calls this after the forward pass: the
        # forward's end, before this step's block copies.
        if self._step is not None and not any(load.layerwise for load in plan.loads):
            self._forward_end = time.perf_counter()
        if not self.before_forward:
            self._transfer(plan)

    def _transfer(self, plan: StepPlan) -> None:
        """The plan's saves (synchronous) and loads (async on the load thread,
        or pulled now when layerwise)."""
        if self.links is not None and plan.peers:
            self.links.note_urls(plan.peers)
        for save in plan.saves:
            self._copy_to_host(list(save.device_blocks), list(save.slots), list(save.hashes))
            with self._lock:
                self._done_send.add(save.req_id)
        self._layerwise = []
        for load in plan.loads:
            if load.layerwise:
                ok = self._safe_pull(load)
                self._layerwise.append((load, ok))
                if not ok:
                    self._fail(load)
                else:
                    self._fail_unloaded(load)
            else:
                self._pool.submit(self._async_load, load)

    def end_step(self) -> None:
        """Publish the step's iteration record: vLLM's scheduled work and the
        time of its forward pass in this process (loads and saves included)."""
        if self._step is None or not self.events_socket:
            return
        start, shape = self._step
        end = self._forward_end or time.perf_counter()
        self._step, self._forward_end = None, None
        if shape["uncached_prompt_tokens"] + shape["generated_tokens"] == 0:
            return
        publish(self.events_socket, StepTimed(t=time.time(), elapsed_ms=(end - start) * 1000.0, **shape))

    def layer_reached(self, layer_name: str) -> None:
        for load, ok in self._layerwise:
            if ok:
                self._copy_to_device(list(load.local_slots), list(load.device_blocks), only=layer_name)

    def finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        with self._lock:
            send, self._done_send = self._done_send, set()
            recv, self._done_recv = self._done_recv, set()
        return send or None, recv or None

    def take_load_errors(self) -> set[int]:
        with self._lock:
            errors, self._errors = self._errors, set()
        return errors

    # -- internals -----------------------------------------------------------
    def _safe_pull(self, load: LoadItem) -> bool:
        """`_pull_remote` that turns any failure (a garbled peer answer
        included) into "recompute": it runs inside vLLM's forward pass."""
        try:
            return self._pull_remote(load)
        except Exception:
            log.exception("KV pull for %s failed; blocks will be recomputed", load.req_id)
            return False

    def _async_load(self, load: LoadItem) -> None:
        try:
            if self._pull_remote(load):
                self._copy_to_device(list(load.local_slots), list(load.device_blocks))
                self._fail_unloaded(load)
            else:
                self._fail(load)
        except Exception:
            log.exception("async KV load for %s failed; blocks will be recomputed", load.req_id)
            self._fail(load)
        finally:
            with self._lock:
                self._done_recv.add(load.req_id)

    def _fail(self, load: LoadItem) -> None:
        with self._lock:
            self._errors.update(load.device_blocks)
            self._errors.update(load.unloaded)

    def _fail_unloaded(self, load: LoadItem) -> None:
        """The blocks vLLM counts as loaded that the plan could not fill."""
        if load.unloaded:
            with self._lock:
                self._errors.update(load.unloaded)

    def _pull_remote(self, load: LoadItem) -> bool:
        """Read the load's remote slots into its staging slots; verify tags."""
        if not load.remote:
            return True
        if self.transport is None or self.links is None:
            return False
        by_node: dict[str, list[RemoteRead]] = {}
        for r in load.remote:
            by_node.setdefault(r.node_id, []).append(r)
        return all(self._pull_from(load, node, reads) for node, reads in by_node.items())

    def _pull_from(self, load: LoadItem, node: str, reads: list[RemoteRead]) -> bool:
        """One peer's share of a load: True when read and verified."""
        assert self.transport is not None and self.links is not None and self.store is not None
        start = time.perf_counter()
        local = [r.local_slot for r in reads]
        outcome, failure = "ok", None
        if not self.links.begin(node):
            outcome = "skipped"  # down: recompute now rather than wait on it again
        else:
            try:
                self.links.connect(node)
                # The staging slots may have held blocks peers still read: no
                # old tag stays on them while the peer's data lands.
                for s in local:
                    self.store.tags[s].zero_()
                self.transport.read_blocks_sync(node, [r.remote_slot for r in reads], local, self.pull_timeout_s)
            except (TransferError, ValueError, httpx.HTTPError) as exc:
                outcome, failure = failure_reason(exc), exc
                if isinstance(exc, TransferTimeout):
                    outcome = "timeout"
                    with self._lock:
                        self._quarantined.extend(local)  # before the load is reported finished
            finally:
                self.links.end(node)
        if failure is not None:
            log.warning(
                "KV pull of %d blocks for %s from %s failed after %.2f s (%s); recomputing",
                len(reads),
                load.req_id,
                node,
                time.perf_counter() - start,
                failure,
            )
            self.links.failed(node, failure)
            outcome = outcome if outcome in ("timeout", "unavailable") else "error"
        elif outcome == "ok":
            expected = dict(zip(load.local_slots, load.hashes, strict=False))
            for r in reads:
                if self.store.tags[r.local_slot].numpy().tobytes() != hash_tag(expected[r.local_slot]):
                    log.info("peer %s slot %d no longer holds the block; recomputing", node, r.remote_slot)
                    outcome = "stale"
                    break
        if self.events_socket:
            elapsed = time.perf_counter() - start
            publish(
                self.events_socket, PullDone(node, outcome, len(reads), elapsed, load.rid or load.req_id, time.time())
            )
        return outcome == "ok"

    def _copy_to_host(self, device_blocks: list[int], slots: list[int], hashes: list[str]) -> None:
        assert self.store is not None
        store = self.store
        dev = torch.tensor(device_blocks, dtype=torch.long)
        dst = torch.tensor(slots, dtype=torch.long)

        def write() -> None:
            for _, view, off in self.layers:
                store.data[dst, off : off + view.shape[1]] = view.index_select(0, dev)

        fill_slots(store, slots, hashes, write)

    def _copy_to_device(self, slots: list[int], device_blocks: list[int], only: str | None = None) -> None:
        assert self.store is not None
        src = torch.tensor(slots, dtype=torch.long)
        dev = torch.tensor(device_blocks, dtype=torch.long)
        for name, view, off in self.layers:
            if only is None or name == only:
                view.index_copy_(0, dev, self.store.data.index_select(0, src)[:, off : off + view.shape[1]])


def fill_slots(store: HostBlockStore, slots: list[int], hashes: list[str], write: Callable[[], None]) -> None:
    """Overwrite `slots` with new blocks: tags zeroed, `write()` (the data),
    then the new tags. A slot the scheduler reuses may still be offered to
    peers under its old block for a heartbeat or two; a peer reads data
    then tag, so while the data changes the tag must name no block, or the
    peer accepts the new data under the old hash (wrong KV, cached and
    served from then on). Zeroed first, such a read reads as stale."""
    for s in slots:
        store.tags[s].zero_()
    write()
    for s, h in zip(slots, hashes, strict=False):
        store.tags[s].copy_(torch.frombuffer(bytearray(hash_tag(h)), dtype=torch.uint8))


def _block_views(t: torch.Tensor) -> list[torch.Tensor]:
    """Byte views [num_blocks, bytes_per_block] of one layer's KV tensor.

    CPU layout [blocks, heads, block_size, 2*head] is block-major (one view);
    a GPU layout [2, blocks, ...] gives one view for K and one for V.
    """
    if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] > 2:
        return [t[i].reshape(t.shape[1], -1).view(torch.uint8) for i in range(2)]
    return [t.reshape(t.shape[0], -1).view(torch.uint8)]
