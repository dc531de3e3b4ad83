"""`PoolConnector`: vLLM KV connector between the paged KV cache and the pool.

Loaded by vLLM through `kv_transfer_config` (`kv_connector_module_path =
"kvpool.connector.pool"`, role `kv_both`). Per request, `kv_transfer_params`
(set by the worker from the gateway's `KVTransferSpec`) carries:

    rid   the worker-level request id     salt  the tenant's hash salt
    load  [{block_hash, node_id, slot}]   peers {node_id: base URL}
    mode  "async" | "layerwise"           save  bool

Scheduler side (EngineCore process): computes the prompt's block hashes,
finds the longest prefix beyond vLLM's own device cache that is in this
node's host store or offered by peers, and plans loads; when a request
finishes (or is aborted for migration) it plans saves of its full computed
blocks. It owns the `SlotIndex` and publishes saved/dropped blocks to the
worker's HTTP process (`workers.events`).

Worker side (model-runner process): owns the host store buffer (registered
with NIXL), copies device blocks <-> host slots and pulls peers' slots.
`async` loads run on a background thread while the request waits in
WAITING_FOR_REMOTE_KVS; `layerwise` loads pull during the step and copy
each layer as the forward pass reaches it. Failures are reported as invalid
blocks, which vLLM recomputes (`kv_load_failure_policy="recompute"`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)

from kvpool.events import BlocksDropped, BlocksSaved, publish
from kvpool.hashing import block_hashes
from kvpool.plan import LoadItem, RemoteRead, SaveItem, SlotIndex, StepPlan, plan_prefix_sources, step_shape

log = logging.getLogger(__name__)
GIB = 1 << 30


@dataclass
class PoolMetadata(KVConnectorMetadata):
    plan: StepPlan = field(default_factory=StepPlan)


@dataclass
class SlotNotices(KVConnectorWorkerMetadata):
    """Worker -> scheduler, per step: staging slots a timed-out read may still
    write (keep them out of use) and slots whose read has now finished."""

    quarantined: tuple[int, ...] = ()
    released: tuple[int, ...] = ()

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, SlotNotices)
        return SlotNotices(self.quarantined + other.quarantined, self.released + other.released)


def block_bytes_of(kv_cache_config) -> int:
    """Bytes of one block across all layers (K and V), from vLLM's config."""
    total = 0
    for group in kv_cache_config.kv_cache_groups:
        total += group.kv_cache_spec.page_size_bytes * len(group.layer_names)
    return total


class PoolConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.node_id: str = extra.get("node_id", "w0")
        self.events_socket: str | None = extra.get("events_socket")
        self.block_size = vllm_config.cache_config.block_size
        self.block_bytes = block_bytes_of(kv_cache_config)
        self.capacity = max(1, int(float(extra.get("store_gib", 0.25)) * GIB) // self.block_bytes)
        if role == KVConnectorRole.SCHEDULER:
            self._sched = _SchedulerSide(self)
        else:
            from kvpool.connector.worker_side import WorkerSide

            self._worker = WorkerSide(self.node_id, self.block_bytes, self.capacity, extra)

    # -- scheduler side ----------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self._sched.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        plan = self._sched.take_plan()
        plan.shape = step_shape(scheduler_output)
        return PoolMetadata(plan=plan)

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._sched.finished(request, block_ids)

    def update_connector_output(self, connector_output) -> None:
        self._sched.on_worker_output(connector_output)

    # -- worker side -------------------------------------------------------
    def register_kv_caches(self, kv_caches) -> None:
        self._worker.register(kv_caches)

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        # Bound right before the forward pass: the step's clock starts here.
        self._worker.begin_step(connector_metadata.plan)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, PoolMetadata)  # build_connector_meta builds no other kind
        self._worker.start_step(meta.plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.layer_reached(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass  # saves happen whole-block when a request finishes

    def wait_for_save(self) -> None:
        # Saves were copied synchronously (before or after the forward pass,
        # WorkerSide); here the forward pass has ended: the step's time is taken.
        self._worker.end_step()

    def get_finished(self, finished_req_ids: set[str]):
        return self._worker.finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        quarantined, released = self._worker.slot_notices()
        return SlotNotices(tuple(quarantined), tuple(released)) if quarantined or released else None

    def shutdown(self) -> None:
        if hasattr(self, "_worker"):
            self._worker.close()


class _SchedulerSide:
    """Bookkeeping only; everything here runs in vLLM's scheduler loop."""

    def __init__(self, c: PoolConnector) -> None:
        self.c = c
        self.index = SlotIndex(c.capacity)
        self.plan = StepPlan()
        self.pending_loads: dict[str, list[tuple[int, str, str | None, int]]] = {}
        self.inflight_saves: dict[str, SaveItem] = {}
        self.inflight_loads: dict[str, LoadItem] = {}
        self.done_loads: set[str] = set()
        self.aborted_loading: set[str] = set()
        self.pulled: set[str] = set()  # requests that already tried a remote pull
        self.save_meta: dict[str, tuple[str, list[str]]] = {}  # vLLM id -> (worker rid, all hashes)

    @staticmethod
    def _params(request) -> dict:
        return request.kv_transfer_params or {}

    def matched(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        p = self._params(request)
        if not p:
            return 0, False
        bs = self.c.block_size
        hashes = block_hashes(request.prompt_token_ids, bs, p.get("salt", ""))
        # vLLM must compute at least the last prompt token itself.
        max_blocks = (len(request.prompt_token_ids) - 1) // bs
        remote = {i: (loc["block_hash"], loc["node_id"], loc["slot"]) for i, loc in enumerate(p.get("load", []))}
        if request.request_id in self.pulled:
            remote = {}  # one pull per request: after a failed one, recompute instead of retrying
        sources = plan_prefix_sources(hashes, num_computed_tokens // bs, max_blocks, self.index, remote)
        sources = self._stageable(sources)
        if not sources:
            return 0, False
        self.pending_loads[request.request_id] = sources
        return len(sources) * bs, p.get("mode", "async") != "layerwise"

    def _stageable(self, sources: list[tuple[int, str, str | None, int]]) -> list[tuple[int, str, str | None, int]]:
        """The prefix of `sources` whose remote blocks can all be staged now:
        vLLM is told exactly the tokens `after_alloc` will load (a block it
        counts as loaded but nobody writes would be read as KV)."""
        need = sum(1 for _, _, node, _ in sources if node is not None)
        room = self.index.available(keep=[slot for _, _, node, slot in sources if node is None], enough=need)
        for n, (_, _, node, _) in enumerate(sources):
            if node is not None:
                if room == 0:
                    return sources[:n]
                room -= 1
        return sources

    def after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        sources = self.pending_loads.pop(request.request_id, None)
        if not sources or num_external_tokens == 0:
            return
        if request.request_id in self.inflight_loads:  # a retry after a failed load
            self._end_load(request.request_id)
            self.done_loads.discard(request.request_id)
        p = self._params(request)
        device = blocks.get_block_ids()[0]
        # Pin the blocks read from this store before reserving staging slots:
        # on a full store `reserve` evicts unpinned blocks, and a staging slot
        # taken from one of them would land a peer's block in it, copied to
        # the device for both blocks (another block's KV, cached by vLLM).
        hits = [slot for _, _, node, slot in sources if node is None]
        self.index.pin(hits)
        staging, dropped = self.index.reserve(sum(1 for s in sources if s[2] is not None))
        self._publish_dropped(dropped)
        reads, local_slots, n_staged = [], [], 0
        for _, _, node, slot in sources:
            if node is None:
                local_slots.append(slot)
            elif n_staged < len(staging):
                reads.append(RemoteRead(node, slot, staging[n_staged]))
                local_slots.append(staging[n_staged])
                n_staged += 1
            else:
                break  # store full of pinned blocks: load a shorter prefix
        first = sources[0][0]
        dev = tuple(device[first : first + len(local_slots)])
        # vLLM counts num_external_tokens as loaded: what this load cannot fill
        # (matched() promised it, the store filled up since) must be recomputed.
        unloaded = tuple(device[first + len(local_slots) : first + num_external_tokens // self.c.block_size])
        item = LoadItem(
            request.request_id,
            dev,
            tuple(local_slots),
            tuple(s[1] for s in sources[: len(local_slots)]),
            tuple(reads),
            layerwise=p.get("mode") == "layerwise",
            rid=p.get("rid", ""),
            unloaded=unloaded,
        )
        if unloaded:
            log.warning("%s: %d KV blocks could not be staged; vLLM recomputes them", request.request_id, len(unloaded))
        for s in staging[n_staged:]:
            self.index.release(s)
        self.index.pin(item.local_slots)
        self.index.unpin(hits)  # net: each slot the load reads pinned once, unused hits not at all
        self.inflight_loads[request.request_id] = item
        if reads:
            self.pulled.add(request.request_id)
        if item.layerwise:
            self.done_loads.add(request.request_id)  # completes within its step
        self.plan.loads.append(item)
        self.plan.peers.update(p.get("peers", {}))

    def take_plan(self) -> StepPlan:
        plan, self.plan = self.plan, StepPlan()
        return plan

    def finished(self, request, block_ids: list[int]) -> tuple[bool, dict | None]:
        if request.request_id in self.inflight_loads and request.request_id not in self.done_loads:
            # Aborted while its blocks are still being written: vLLM frees
            # them when the worker reports the load finished.
            self.aborted_loading.add(request.request_id)
            return True, None
        self.done_loads.discard(request.request_id)
        self.pulled.discard(request.request_id)
        self._end_load(request.request_id)
        p = self._params(request)
        if not p or not p.get("save", True):
            return False, None
        bs = self.c.block_size
        n_full = min(request.num_computed_tokens, len(request.all_token_ids)) // bs
        hashes = block_hashes(request.all_token_ids[: n_full * bs], bs, p.get("salt", ""))
        new = [(i, h) for i, h in enumerate(hashes) if self.index.lookup(h) is None and i < len(block_ids)]
        slots, dropped = self.index.reserve(len(new))
        self._publish_dropped(dropped)
        new = new[: len(slots)]
        if not new:
            self._publish_saved(p.get("rid", request.request_id), [(h, self.index.lookup(h)) for h in hashes])
            return False, None
        item = SaveItem(request.request_id, tuple(block_ids[i] for i, _ in new), tuple(slots), tuple(h for _, h in new))
        self.index.pin(item.slots)
        self.inflight_saves[request.request_id] = item
        self.save_meta[request.request_id] = (p.get("rid", request.request_id), hashes)
        self.plan.saves.append(item)
        return True, None

    def on_worker_output(self, out) -> None:
        notices = getattr(out, "kv_connector_worker_meta", None)
        if isinstance(notices, SlotNotices):
            # Before any finished load below can release its staging slots.
            self.index.quarantine(notices.quarantined)
            self.index.unquarantine(notices.released)
            if notices.quarantined:
                log.warning("%d staging slots quarantined after a timed-out KV pull", len(notices.quarantined))
        for rid in out.finished_sending or ():
            item = self.inflight_saves.pop(rid, None)
            if item is None:
                continue
            for h, s in zip(item.hashes, item.slots, strict=False):
                self.index.commit(h, s)
            self.index.unpin(item.slots)
            worker_rid, hashes = self.save_meta.pop(rid)
            self._publish_saved(worker_rid, [(h, self.index.lookup(h)) for h in hashes])
        for rid in out.finished_recving or ():
            if rid in self.aborted_loading:
                self.aborted_loading.discard(rid)
                self._end_load(rid)
            elif rid in self.inflight_loads:
                self.done_loads.add(rid)

    def _end_load(self, rid: str) -> None:
        item = self.inflight_loads.pop(rid, None)
        if item is None:
            return
        self.index.unpin(item.local_slots)
        staged = {r.local_slot for r in item.remote}
        for _h, s in zip(item.hashes, item.local_slots, strict=False):
            if s in staged:
                self.index.release(s)  # staging only; the block stays the peer's

    def _publish_saved(self, rid: str, blocks: list[tuple[str, int | None]]) -> None:
        if self.c.events_socket:
            publish(
                self.c.events_socket, BlocksSaved(rid=rid, blocks=tuple((h, s) for h, s in blocks if s is not None))
            )

    def _publish_dropped(self, dropped: list[tuple[str, int]]) -> None:
        if dropped and self.c.events_socket:
            publish(self.c.events_socket, BlocksDropped(blocks=tuple(dropped)))
