"""The simulated cluster: workload -> real router -> nodes; real planner ticks.

Per request: prefix lookup in the directory, `routing.route` over a
candidate set of nodes, prefill (with KV prefetch: async, or layer-by-layer),
KV transfer to the decode node, decode; closed-loop dependents released on
completion. Every `tick_s` the planner observes the iteration records and
finished requests gathered since the last tick and decides; its actions are
applied as in-place switches (drain/migrate) or relaunches (node offline for
the relaunch delay). Deterministic for a seed.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from core import Phase
from planner.types import SLO, ClusterView, IterationRecord, NodeState, Planner, RequestSample
from routing import NodeLoad, RouteDecision, RouterConfig, RouteRequest, pick_decode, route
from sim.directory import Directory, PrefixHits, make_directory
from sim.events import EventLoop
from sim.metrics import RunLog
from sim.node import NodeStatus, SimNode
from sim.profiles import GpuProfile
from sim.state import NodeConfig, RawRecord, SimRequest
from sim.switching import Switcher
from sim.workloads import Request, Workload


@dataclass(frozen=True)
class SimConfig:
    nodes: int
    prefill_nodes: int  # initial split
    horizon_s: float | None = None  # default: the workload's duration
    tick_s: float = 10.0  # planner period
    seed: int = 0
    layerwise_kv: bool = False
    switch_mode: Literal["auto", "inplace", "relaunch"] = "auto"  # auto: relaunch iff planner has relaunch_delay_s
    sample_above: int = 16  # above this many serving nodes the router scores a sample (power of d choices):
    # ...this many random nodes of each phase, plus the 4 with the longest cached prefix. Two (the
    # power of two choices) routed better at 768 nodes than four: 1,054,325 vs 1,042,551 requests
    # finished in 20 min, mean E2E 7.35 vs 7.57 s (docs/benchmarks-history.md).
    sample_per_phase: int = 2
    host_blocks_per_node: int = 8_192  # host-store capacity, blocks
    records_per_node_tick: int = 32  # iteration records per node handed to the planner per tick...
    records_per_tick: int = 1_024  # ...and in all (the fit needs no more; 3,072 GPUs would hand it 24k)
    directory: Literal["memory", "local"] = "memory"  # memory: kvpool's real in-memory directory
    slo: SLO = SLO()
    flap_window_s: float = 600.0  # a split reversal within this is a flap (sim.metrics)
    router: RouterConfig = RouterConfig()

    def __post_init__(self) -> None:
        if not 0 <= self.prefill_nodes <= self.nodes or self.nodes <= 0:
            raise ValueError("need 0 <= prefill_nodes <= nodes and nodes > 0")
        if self.tick_s <= 0 or self.sample_per_phase <= 0:
            raise ValueError("tick_s and sample_per_phase must be > 0")
        if self.records_per_node_tick < 1 or self.records_per_tick < 1:
            raise ValueError("records_per_node_tick and records_per_tick must be >= 1")
        if self.flap_window_s < 0:
            raise ValueError("flap_window_s must be >= 0")


class Cluster:
    def __init__(self, workload: Workload, gpu: GpuProfile, planner: Planner | None, cfg: SimConfig) -> None:
        self.wl, self.gpu, self.planner, self.cfg = workload, gpu, planner, cfg
        self.loop = EventLoop()
        node_cfg = gpu.node if not cfg.layerwise_kv else _with(gpu.node, layerwise_kv=True)
        self.node_cfg = node_cfg
        self.records: list[RawRecord] = []  # IterationRecord fields, not yet thinned
        self.nodes: dict[str, SimNode] = {}
        for i in range(cfg.nodes):
            nid = f"n{i:04d}"
            phase = Phase.PREFILL if i < cfg.prefill_nodes else Phase.DECODE
            node = SimNode(
                nid,
                phase,
                self.loop,
                gpu.model,
                node_cfg,
                self._prefill_done,
                self._first_token,
                self._decode_done,
                self.records,
            )
            node.on_change = self._serving_changed
            node.prefill.extend_cached = node.decode.extend_cached = self._cached_on(nid)
            self.nodes[nid] = node
        self._serving: list[SimNode] | None = None  # accepting nodes; rebuilt after a status/phase change
        self._by_phase: tuple[list[SimNode], list[SimNode]] = ([], [])  # ...split into prefill, decode
        self._pick = random.Random(cfg.seed)  # candidate sampling: O(k), unlike numpy's choice without replacement
        self.directory: Directory = make_directory(
            cfg.host_blocks_per_node,
            workload.block_tokens * node_cfg.kv_bytes_per_token,
            lambda: self.loop.now,
            cfg.directory,
        )
        self.log = RunLog(ttft_slo_s=cfg.slo.ttft_s, tpot_slo_s=cfg.slo.tpot_s, flap_window_s=cfg.flap_window_s)
        self._inflight: dict[int, float] = {}  # req_id -> arrival, until it finishes
        self.samples: list[RequestSample] = []
        mode = cfg.switch_mode
        relaunch = getattr(planner, "relaunch_delay_s", None)
        if mode == "auto":
            kind = getattr(planner, "switch_kind", None)
            mode = kind if kind in ("inplace", "relaunch") else ("relaunch" if relaunch is not None else "inplace")
        delay = float(relaunch) if relaunch is not None else gpu.relaunch_s
        self.switcher = Switcher(self, relaunch_s=delay if mode == "relaunch" else None)
        self._deps: dict[int, list[Request]] = {}
        self._pending: dict[int, int] = {}
        self._horizon = cfg.horizon_s if cfg.horizon_s is not None else workload.duration_s

    # -- run -------------------------------------------------------------------
    def run(self) -> RunLog:
        with _rare_gc_passes():
            closed = self.wl.closed_loop
            deps, at = self._deps, self.loop.at
            for r in self.wl.requests:
                if r.after and closed:
                    self._pending[r.req_id] = len(r.after)
                    for a in r.after:
                        if a in deps:
                            deps[a].append(r)
                        else:
                            deps[a] = [r]
                else:
                    at(r.arrival_s, self._arrive, r)
            if self.planner is not None:
                self.loop.at(self.cfg.tick_s, self._tick)
            self._sample_split()
            self.loop.run(self._horizon)
        for n in self.nodes.values():
            n.close_phase_clock(self._horizon)
        self.log.unfinished_arrivals = list(self._inflight.values())
        self.log.finish(self.nodes.values(), self.switcher.events, self.loop.processed, self._horizon)
        return self.log

    def _cached_on(self, node_id: str) -> Callable[[SimRequest], int]:
        """`node_id`'s schedule-time prefix lookup (`sim.node`): the request's
        cached tokens, extended by the blocks after them this node holds now."""
        bt = self.wl.block_tokens

        def cached(sr: SimRequest) -> int:
            hashes = sr.req.block_hashes
            cap = sr.req.prompt_tokens - 1
            start = sr.cached // bt
            if not hashes or sr.cached >= cap or start >= len(hashes):
                return sr.cached
            end = self.directory.extend_prefix(node_id, hashes, start)
            return sr.cached if end == start else max(sr.cached, min(cap, end * bt))

        return cached

    # -- routing ---------------------------------------------------------------
    def _serving_changed(self) -> None:
        self._serving = None

    def _candidates(self, hits: PrefixHits | None, decode_only: bool = False) -> list[NodeLoad]:
        """Every serving node, or above `sample_above` a random sample of
        `sample_per_phase` nodes of each phase plus the 4 with the longest
        cached prefix; with `decode_only`, of the decode nodes only."""
        if self._serving is None:
            self._serving = [n for n in self.nodes.values() if n.accepting]
            self._by_phase = (
                [n for n in self._serving if n.phase is Phase.PREFILL],
                [n for n in self._serving if n.phase is Phase.DECODE],
            )
        serving = self._serving
        groups = self._by_phase[1:] if decode_only else self._by_phase
        if len(serving) > self.cfg.sample_above:
            k, rnd = self.cfg.sample_per_phase, self._pick.random
            # k draws with replacement (duplicates collapse): random.sample's checks cost more than the draws
            chosen = {
                n.node_id: n
                for group in groups
                for n in (group if len(group) <= k else [group[int(rnd() * len(group))] for _ in range(k)])
            }
            for nid in hits.top(4) if hits is not None else ():
                node = self.nodes[nid]
                if node.accepting and (not decode_only or node.phase is Phase.DECODE):
                    chosen[nid] = node
            serving = list(chosen.values())
        elif decode_only:
            serving = groups[0]
        return [n.load() for n in serving]

    def _route(
        self, prompt: int, pool_cached: int, hits: PrefixHits | None, cap: int
    ) -> tuple[RouteDecision, dict[str, int]]:
        """Route over the candidates; also returns their cached tokens {node: tokens} (≤ cap)."""
        loads = self._candidates(hits)
        tokens = self._cached_tokens(loads, hits, cap)
        return route(RouteRequest(prompt, tokens, pool_cached), loads, self.cfg.router), tokens

    def _cached_tokens(self, loads: list[NodeLoad], hits: PrefixHits | None, cap: int) -> dict[str, int]:
        """{node: prefix tokens it holds (≤ cap)} over `loads`; nodes holding none are absent."""
        bt = self.wl.block_tokens
        tokens = {}
        if hits is not None and cap > 0:
            for load in loads:
                b = hits.get(load.node_id)
                if b:
                    tokens[load.node_id] = min(cap, b * bt)
        return tokens

    def _arrive(self, req: Request) -> None:
        now = self.loop.now
        sr = SimRequest(req, now)
        hits = None
        pool = 0
        if req.block_hashes:
            pool, hits = self.directory.lookup(req.block_hashes)
            self.directory.retain(req.branch_id, req.block_hashes)
        cap = max(0, req.prompt_tokens - 1)
        d, tokens = self._route(req.prompt_tokens, min(cap, pool * self.wl.block_tokens), hits, cap)
        sr.cached = min(cap, d.cached_tokens)
        self.log.arrived += 1
        self._inflight[req.req_id] = now
        self._dispatch(sr, d.prefill_node, d.decode_node, tokens)

    def _dispatch(self, sr: SimRequest, prefill: str | None, decode: str, tokens: dict[str, int]) -> None:
        now, ncfg = self.loop.now, self.node_cfg
        target = prefill or decode
        local = min(sr.cached, tokens.get(target, 0))
        fetch = ncfg.pool_s(sr.cached - local, prefill=prefill is not None) + ncfg.d2h_s(local)
        sr.decode_node, sr.prefill_node = decode, prefill or ""
        sr.decode_cached = tokens.get(decode, 0)
        now += ncfg.engine_in_s
        if prefill is None:
            sr.local_prefill = True
            sr.ready_at = now + fetch
            self.nodes[decode].decode.submit(sr)
        elif ncfg.layerwise_kv:
            sr.ready_at, sr.stall_s = now, fetch
            self.nodes[prefill].prefill.submit(sr)
        else:
            sr.ready_at = now + fetch
            self.nodes[prefill].prefill.submit(sr)

    def reroute(self, sr: SimRequest) -> None:
        """Send a request taken off a switching node through the router again."""
        if sr.first_token is None and not sr.local_prefill:
            hits = self.directory.lookup(sr.req.block_hashes)[1] if sr.req.block_hashes else None
            d, _ = self._route(sr.req.prompt_tokens, sr.cached, hits, 0)
            self._dispatch(sr, d.prefill_node, d.decode_node, {})
        else:
            self.to_decode(sr, ready_at=self.loop.now)

    def to_decode(self, sr: SimRequest, ready_at: float) -> None:
        """Hand a request whose KV exists (prefilled or migrated) to a decode node."""
        node = self.nodes.get(sr.decode_node)
        if node is None or not node.accepting or node.phase is not Phase.DECODE:
            d, _ = self._route(sr.context, sr.context, None, 0)
            node = self.nodes[d.decode_node]
        sr.local_prefill = sr.local_prefill and sr.first_token is None
        sr.ready_at = ready_at
        node.decode.submit(sr)

    # -- node callbacks --------------------------------------------------------
    def _prefill_done(self, sr: SimRequest, now: float) -> None:
        ncfg = self.node_cfg
        now += ncfg.engine_out_s  # the token leaves the prefill engine
        sr.first_token = now + ncfg.prefill_answer_s
        if sr.req.block_hashes and sr.prefill_node:
            self.directory.publish(sr.prefill_node, sr.req.block_hashes)
        sr.generated = 1
        if sr.req.output_tokens <= 1:
            self._finish(sr, sr.first_token)
            return
        self._bind_decode(sr)
        missing = sr.req.prompt_tokens - sr.decode_cached
        self.to_decode(sr, now + ncfg.handoff_s + ncfg.engine_in_s + ncfg.pool_s(missing))

    def _bind_decode(self, sr: SimRequest) -> None:
        """Pick the decode node now that the prefill is done, on the loads of
        now, as the gateway does (it routes each segment as the segment
        starts, `gateway.serving.orchestrator`). Picked at arrival, behind a
        prefill queue of minutes, the choice was that stale: after a switch
        the backlog all went to the decode nodes of the old split (Mooncake
        conversation overload: 1,400 waiting on one decode node while the
        one added beside it stayed empty)."""
        req = sr.req
        hits = self.directory.lookup(req.block_hashes)[1] if req.block_hashes else None
        loads = self._candidates(hits, decode_only=True)
        if not loads:
            return  # no decode node now: `to_decode` routes it once the prefill's KV is handed over
        cap = max(0, req.prompt_tokens - 1)
        tokens = self._cached_tokens(loads, hits, cap)
        node = pick_decode(RouteRequest(req.prompt_tokens, tokens, cap), loads, self.cfg.router).node_id
        sr.decode_node = node
        sr.decode_cached = tokens.get(node, 0)

    def _first_token(self, sr: SimRequest, t: float) -> None:
        if sr.first_token is None:
            sr.first_token = t + self.node_cfg.engine_out_s

    def _decode_done(self, sr: SimRequest, now: float) -> None:
        """The request's last iteration ended at `now`."""
        ncfg = self.node_cfg
        # A prefill's late answer is still the first token the client sees.
        self._finish(sr, max(now + ncfg.engine_out_s + ncfg.stream_lag_s, sr.first_token or now))

    def _finish(self, sr: SimRequest, now: float) -> None:
        """The client has the request's last token at `now`."""
        sr.finish = now
        req = sr.req
        del self._inflight[req.req_id]
        if req.block_hashes and sr.decode_node:
            self.directory.publish(sr.decode_node, req.block_hashes)
        if req.last_in_branch and req.block_hashes:
            self.directory.release(req.branch_id)
        self.log.done(sr)
        gap = req.gap_s if req.after and self.wl.closed_loop else None
        self.samples.append(
            RequestSample(
                sr.arrival,
                req.prompt_tokens - sr.cached,
                sr.cached,
                req.output_tokens,
                e2e_s=now - sr.arrival,
                gap_s=gap,
                ttft_s=None if sr.first_token is None else sr.first_token - sr.arrival,
            )
        )
        for dep in self._deps.pop(req.req_id, ()):
            left = self._pending[dep.req_id] - 1
            self._pending[dep.req_id] = left
            if left == 0:
                self.loop.at(now + dep.gap_s, self._arrive, dep)

    # -- planner ---------------------------------------------------------------
    def _tick(self) -> None:
        assert self.planner is not None
        now = self.loop.now
        recs, self.records[:] = self._thin(self.records), []
        self.planner.observe_iterations(recs)
        self.planner.observe_requests(self.samples)
        self.samples = []
        decision = self.planner.decide(self.view())
        self.log.decisions += 1
        self._log_check(decision.inputs, now, decision.acted)
        for a in decision.actions:
            self.switcher.switch(a.node_id, a.to_phase, now)
        self._sample_split()
        self.loop.at(now + self.cfg.tick_s, self._tick)

    def _log_check(self, inputs: dict[str, float], now: float, acted: bool) -> None:
        """A move check the decision carries (`planner.verification`), and the revert it made."""
        if "verified_move_t" not in inputs:
            return
        reverted = acted and inputs.get("move_reverted", 0.0) > 0
        keys = ("verified_move_t", "verified_from_prefill", "verified_to_prefill", "predicted_gain_frac")
        check = [round(inputs[k], 4) for k in keys]
        check += [round(inputs["realized_gain_frac"], 4), float(reverted), inputs.get("move_delivered", 0.0)]
        self.log.move_checks.append(check)
        if reverted:
            self.log.reverts.append(now)

    def _thin(self, recs: list[RawRecord]) -> list[IterationRecord]:
        per_node: dict[str, list[RawRecord]] = {}
        for r in recs:
            per_node.setdefault(r[0], []).append(r)
        k = min(self.cfg.records_per_node_tick, max(1, self.cfg.records_per_tick // max(1, len(per_node))))
        out: list[IterationRecord] = []
        for rs in per_node.values():
            picked = rs if len(rs) <= k else [rs[int(i)] for i in np.linspace(0, len(rs) - 1, k)]
            out += [IterationRecord(*r) for r in picked]
        out.sort(key=lambda r: r.t)
        return out

    def view(self) -> ClusterView:
        states = []
        for n in self.nodes.values():
            phase, load = n.draining_to or n.phase, n.load()
            states.append(
                NodeState(
                    n.node_id,
                    phase,
                    draining=not n.accepting,
                    queue=load.queue,
                    running=load.running,
                    kv_usage=load.kv_usage,
                    kv_capacity_tokens=self.node_cfg.kv_capacity_tokens,
                )
            )
        return ClusterView(
            self.loop.now,
            tuple(states),
            slo=self.cfg.slo,
            last_switch_t=self.switcher.last_switch_t,
            requests_arrived=self.log.arrived,
            requests_rejected=0,  # the simulated gateway admits every request
        )

    def split(self) -> tuple[int, int, int]:
        p = sum(1 for n in self.nodes.values() if n.accepting and n.phase is Phase.PREFILL)
        d = sum(1 for n in self.nodes.values() if n.accepting and n.phase is Phase.DECODE)
        return p, d, len(self.nodes) - p - d

    def _sample_split(self) -> None:
        self.log.split.append((self.loop.now, *self.split()))


@contextmanager
def _rare_gc_passes() -> Iterator[None]:
    """A run allocates millions of short-lived objects (events, segments,
    records) beside millions of live ones (the workload, finished rows).
    CPython's default thresholds (700, 10, 10) scan the young generation every
    700 allocations and the live ones often, a large share of a big run's
    time (docs/benchmarks-history.md, scale). Cycles are still collected, only
    less often."""
    old = gc.get_threshold()
    gc.set_threshold(50_000, 50, 1_000)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _with(cfg: NodeConfig, **kw: Any) -> NodeConfig:
    from dataclasses import replace

    return replace(cfg, **kw)


__all__ = ["Cluster", "NodeStatus", "SimConfig"]
