"""Worker half of `PoolConnector`: bytes between vLLM's paged cache and the pool.

Runs in vLLM's model-runner process. Owns the host store buffer (one
`HostBlockStore` region: data slots + hash tags) registered with NIXL, and
does exactly what the scheduler half's `StepPlan` says:

- saves: device blocks -> host slots, synchronously in the next step (a
  memcpy; the blocks are held for us until we report them);
- async loads: on a background thread, pull remote slots over NIXL into
  staging slots, verify their tags, copy host -> device, report the request
  in `finished_recving`;
- layerwise loads: pull during the step, copy each layer as the forward
  pass reaches it.

A failed load reports its device blocks as invalid; vLLM recomputes them.

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
import pathlib
import threading
import time

import httpx
import torch

from kvpool.agent_info import AgentInfo
from kvpool.events import StepTimed, publish
from kvpool.hashing import hash_tag
from kvpool.plan import LoadItem, StepPlan
from kvpool.store import HostBlockStore, StoreConfig

log = logging.getLogger(__name__)

# Reads of a few blocks take milliseconds; a peer that has not answered in
# this long is dead or wedged, and every load queued behind it would wait too.
PULL_TIMEOUT_S = 3.0
BAD_PEER_COOLDOWN_S = 30.0


class WorkerSide:
    def __init__(self, node_id: str, block_bytes: int, capacity: int, extra: dict) -> None:
        self.node_id, self.block_bytes, self.capacity = node_id, block_bytes, capacity
        self.run_dir = pathlib.Path(extra.get("run_dir", "data/run"))
        self.use_nixl = bool(extra.get("nixl", True))
        self.layers: list[tuple[str, torch.Tensor, int]] = []  # (layer, u8 view [blocks, bytes], offset)
        self.store: HostBlockStore | None = None
        self.transport = None
        self._peers: dict[str, str] = {}
        self._bad_peers: dict[str, float] = {}  # node -> monotonic time until which it is skipped
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

            self.transport = NixlTransport(self.node_id, self.store, NixlTransportConfig(progress_interval_s=0.05))
            info = dataclasses.replace(
                info,
                agent_name=self.node_id,
                region_base=self.store.buffer.data_ptr(),
                metadata_b64=base64.b64encode(self.transport.local_descriptor()).decode(),
            )
        info.write(self.run_dir)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
        if self.transport is not None:
            self.transport.close()

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
        self._peers.update(plan.peers)
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

    def _pull_remote(self, load: LoadItem) -> bool:
        """Read the load's remote slots into its staging slots; verify tags."""
        if not load.remote:
            return True
        if self.transport is None:
            return False
        from kvpool.transport.base import TransferError

        by_node: dict[str, list] = {}
        for r in load.remote:
            by_node.setdefault(r.node_id, []).append(r)
        node = ""
        try:
            for node, reads in by_node.items():
                if time.monotonic() < self._bad_peers.get(node, 0.0):
                    return False  # failed recently: recompute at once instead of waiting on it again
                self._ensure_peer(node)
                self.transport.read_blocks_sync(
                    node, [r.remote_slot for r in reads], [r.local_slot for r in reads], timeout_s=PULL_TIMEOUT_S
                )
        except (TransferError, ValueError, httpx.HTTPError) as exc:
            log.warning(
                "KV pull for %s from %s failed: %s; skipping that peer for %.0f s",
                load.req_id,
                node,
                exc,
                BAD_PEER_COOLDOWN_S,
            )
            self._bad_peers[node] = time.monotonic() + BAD_PEER_COOLDOWN_S
            self.transport.remove_peer(node)  # a restarted peer comes back with new metadata
            return False
        expected = dict(zip(load.local_slots, load.hashes, strict=False))
        assert self.store is not None
        for r in load.remote:
            if self.store.tags[r.local_slot].numpy().tobytes() != hash_tag(expected[r.local_slot]):
                log.warning("peer %s slot %d no longer holds the block; recomputing", r.node_id, r.remote_slot)
                return False
        return True

    def _ensure_peer(self, node_id: str) -> None:
        if node_id in self.transport.peers():
            return
        url = self._peers.get(node_id)
        if url is None:
            raise ValueError(f"no address for peer {node_id}")
        info = AgentInfo(**httpx.get(f"{url}/internal/kv/agent", timeout=5.0).raise_for_status().json())
        self.transport.add_peer(node_id, base64.b64decode(info.metadata_b64))

    def _copy_to_host(self, device_blocks: list[int], slots: list[int], hashes: list[str]) -> None:
        assert self.store is not None
        dev = torch.tensor(device_blocks, dtype=torch.long)
        dst = torch.tensor(slots, dtype=torch.long)
        for _, view, off in self.layers:
            self.store.data[dst, off : off + view.shape[1]] = view.index_select(0, dev)
        for s, h in zip(slots, hashes, strict=False):
            self.store.tags[s].copy_(torch.frombuffer(bytearray(hash_tag(h)), dtype=torch.uint8))

    def _copy_to_device(self, slots: list[int], device_blocks: list[int], only: str | None = None) -> None:
        assert self.store is not None
        src = torch.tensor(slots, dtype=torch.long)
        dev = torch.tensor(device_blocks, dtype=torch.long)
        for name, view, off in self.layers:
            if only is None or name == only:
                view.index_copy_(0, dev, self.store.data.index_select(0, src)[:, off : off + view.shape[1]])


def _block_views(t: torch.Tensor) -> list[torch.Tensor]:
    """Byte views [num_blocks, bytes_per_block] of one layer's KV tensor.

    CPU layout [blocks, heads, block_size, 2*head] is block-major (one view);
    a GPU layout [2, blocks, ...] gives one view for K and one for V.
    """
    if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] > 2:
        return [t[i].reshape(t.shape[1], -1).view(torch.uint8) for i in range(2)]
    return [t.reshape(t.shape[0], -1).view(torch.uint8)]
