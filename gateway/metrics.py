"""Prometheus metrics of the gateway process (one registry per app, no globals).

Exported names (all prefixed `evolving_`):

    evolving_requests_total{tenant,endpoint,status}      OpenAI requests by HTTP status
    evolving_ttft_seconds{tenant,phase}                  time to first token; phase = node
                                                         phase that produced it (prefill|decode)
    evolving_tpot_seconds{tenant,phase}                  mean time per output token after the first
    evolving_e2e_seconds{tenant,phase}                   request end to end
    evolving_tokens_total{tenant,kind}                   kind = prompt|cached|completion
    evolving_stream_resumes_total{tenant}                streams continued on another node
    evolving_streams_cut_total{tenant}                   streams the gateway's shutdown ended mid-answer
                                                         (answered `gateway_shutting_down`, never silent)
    evolving_node_queue_depth{node}                      waiting requests per worker
    evolving_node_running{node}                          running requests per worker
    evolving_node_phase{node,phase}                      1 for the node's current phase
    evolving_node_healthy{node}                          1 healthy, 0 not
    evolving_switches_total{to_phase,outcome}            phase switches (ok|failed|noop)
    evolving_switch_duration_seconds{stage}              stage = drain|migrate|total
    evolving_pool_hit_rate                               cached prompt tokens / looked-up tokens
    evolving_directory_blocks                            blocks in the KV directory
    evolving_directory_referenced_blocks                 blocks held by an active branch
    evolving_directory_branches                          active branches
    evolving_kv_pulls_total{node,peer,outcome}           a worker's pulls from a peer's host store;
                                                         outcome = ok|stale|timeout|unavailable|error|skipped
    evolving_kv_pulled_blocks_total{node,peer}           blocks pulled and verified
    evolving_kv_peer_up{node,peer}                       1 while the node pulls from the peer, 0 while
                                                         it is down (loads recompute until it answers)
    evolving_kv_peer_downs_total{node,peer}              times the peer went down for the node
    evolving_kv_pulled_bytes_total{node,peer}            bytes of the blocks pulled (blocks x the node's block bytes)
    evolving_planner_predicted_rps{split}                the last decision's predicted requests/s served of the
                                                         offered load; split = chosen|current (absent: no prediction)
    evolving_planner_confidence                          the last decision's confidence

Cardinality is bounded: `tenant` takes at most `max_tenants` distinct values
and `endpoint` at most `max_endpoints` (callers pass route names, never raw
paths: an unknown path is "other"); values past a cap are counted under
`OTHER`, so no client can grow the series count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from core import Phase

if TYPE_CHECKING:  # types only: every layer reports here, this module imports none of them
    from gateway.control.registry import WorkerRegistry
    from gateway.kv.views import DirectoryStatus
    from gateway.serving.jobs import Finished
    from gateway.store.records import SwitchOutcome
    from planner.types import Decision

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
_SWITCH_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)


OTHER = "(other)"  # the label value past a cardinality cap


class _BoundedLabel:
    """The first `cap` distinct values pass; later ones become `OTHER`."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self._cap:
            return OTHER
        self._seen.add(value)
        return value


class _KVPeerCollector:
    """Workers count their pulls themselves; this exports the counts of the
    last heartbeat (so they are counters that reset when a worker restarts)."""

    def __init__(self) -> None:
        self.nodes: list[tuple[str, tuple, int]] = []  # (node_id, its KVPeerStats, its block bytes)

    def collect(self) -> Iterator[Metric]:
        pulls = CounterMetricFamily("evolving_kv_pulls", "KV pulls from peers", labels=["node", "peer", "outcome"])
        blocks = CounterMetricFamily("evolving_kv_pulled_blocks", "KV blocks pulled", labels=["node", "peer"])
        up = GaugeMetricFamily("evolving_kv_peer_up", "1 while a node pulls from a peer", labels=["node", "peer"])
        downs = CounterMetricFamily("evolving_kv_peer_downs", "Times a peer went down", labels=["node", "peer"])
        nbytes = CounterMetricFamily("evolving_kv_pulled_bytes", "KV bytes pulled", labels=["node", "peer"])
        for node, peers, block_bytes in self.nodes:
            for p in peers:
                nbytes.add_metric([node, p.peer], p.blocks * block_bytes)
                for outcome, n in sorted(p.pulls.items()):
                    pulls.add_metric([node, p.peer, outcome], n)
                blocks.add_metric([node, p.peer], p.blocks)
                up.add_metric([node, p.peer], 1.0 if p.state == "up" else 0.0)
                downs.add_metric([node, p.peer], p.downs)
        yield from (pulls, blocks, up, downs, nbytes)


class GatewayMetrics:
    def __init__(self, *, max_tenants: int = 1000, max_endpoints: int = 32) -> None:
        self._tenant = _BoundedLabel(max_tenants)
        self._endpoint = _BoundedLabel(max_endpoints)
        # Label children by key: `.labels()` costs a lock and a tuple build per call.
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._finished_children: dict[tuple[str, str], tuple[Any, ...]] = {}
        r = self.registry = CollectorRegistry()
        self._kv_peers = _KVPeerCollector()
        r.register(self._kv_peers)
        self.requests = Counter(
            "evolving_requests", "OpenAI API requests", ["tenant", "endpoint", "status"], registry=r
        )
        self.ttft = Histogram(
            "evolving_ttft_seconds", "Time to first token", ["tenant", "phase"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "evolving_tpot_seconds", "Time per output token", ["tenant", "phase"], buckets=_TPOT_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "evolving_e2e_seconds", "End-to-end latency", ["tenant", "phase"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tokens = Counter("evolving_tokens", "Tokens by kind", ["tenant", "kind"], registry=r)
        self.resumes = Counter("evolving_stream_resumes", "Streams resumed on another node", ["tenant"], registry=r)
        self.streams_cut = Counter(
            "evolving_streams_cut", "Streams the gateway's shutdown ended mid-answer", ["tenant"], registry=r
        )
        self.queue = Gauge("evolving_node_queue_depth", "Waiting requests per worker", ["node"], registry=r)
        self.running = Gauge("evolving_node_running", "Running requests per worker", ["node"], registry=r)
        self.phase = Gauge("evolving_node_phase", "Worker phase (1 = current)", ["node", "phase"], registry=r)
        self.healthy = Gauge("evolving_node_healthy", "Worker health", ["node"], registry=r)
        self.engine_dead = Gauge(
            "evolving_node_engine_dead",
            "1: the worker's process lives, its engine died (dead, or restarting in place)",
            ["node"],
            registry=r,
        )
        self.engine_restarts = Gauge(
            "evolving_node_engine_restarts",
            "Engine cores the worker's current process restarted in place of dead ones",
            ["node"],
            registry=r,
        )
        self.restarts = Gauge(
            "evolving_node_restarts", "Worker process restarts this gateway saw (new start time)", ["node"], registry=r
        )
        self.switches = Counter("evolving_switches", "Phase switches", ["to_phase", "outcome"], registry=r)
        self.switch_seconds = Histogram(
            "evolving_switch_duration_seconds", "Phase switch durations", ["stage"], buckets=_SWITCH_BUCKETS, registry=r
        )
        self.pool_hit_rate = Gauge("evolving_pool_hit_rate", "Cached prompt tokens / looked-up tokens", registry=r)
        self.directory_blocks = Gauge("evolving_directory_blocks", "Blocks in the KV directory", registry=r)
        self.directory_referenced = Gauge(
            "evolving_directory_referenced_blocks", "Blocks referenced by active branches", registry=r
        )
        self.directory_branches = Gauge("evolving_directory_branches", "Active branches", registry=r)
        self.planner_predicted = Gauge(
            "evolving_planner_predicted_rps", "Planner's predicted requests/s served", ["split"], registry=r
        )
        self.planner_confidence = Gauge("evolving_planner_confidence", "Planner's last decision confidence", registry=r)

    def observe_request(self, tenant: str, endpoint: str, status: int) -> None:
        key = (tenant, endpoint, status)
        child = self._request_children.get(key)
        if child is None:
            labels = (self._tenant(tenant), self._endpoint(endpoint), str(status))
            child = self.requests.labels(*labels)
            if len(self._request_children) < 4096:  # statuses are few; the caps bound the rest
                self._request_children[key] = child
        child.inc()

    def observe_finished(self, tenant: str, done: Finished) -> None:
        phase = (done.first_phase or Phase.DECODE).value
        key = (tenant, phase)
        children = self._finished_children.get(key)
        if children is None:
            t = self._tenant(tenant)
            children = (
                self.ttft.labels(t, phase),
                self.tpot.labels(t, "decode"),
                self.e2e.labels(t, phase),
                self.tokens.labels(t, "prompt"),
                self.tokens.labels(t, "cached"),
                self.tokens.labels(t, "completion"),
            )
            if len(self._finished_children) < 4096:
                self._finished_children[key] = children
        ttft, tpot, e2e, prompt, cached, completion = children
        if done.completion_tokens:
            ttft.observe(done.ttft_s)
        if done.completion_tokens > 1:
            tpot.observe((done.e2e_s - done.ttft_s) / (done.completion_tokens - 1))
        e2e.observe(done.e2e_s)
        prompt.inc(done.prompt_tokens)
        cached.inc(done.cached_tokens)
        completion.inc(done.completion_tokens)
        if done.resumes:
            self.resumes.labels(self._tenant(tenant)).inc(done.resumes)

    def observe_stream_cut(self, tenant: str) -> None:
        self.streams_cut.labels(self._tenant(tenant)).inc()

    def observe_switch(self, outcome: SwitchOutcome, reason: str, who: str) -> None:
        """A `gateway.control.phase_switch.SwitchSink`."""
        self.switches.labels(outcome.to_phase.value, outcome.outcome).inc()
        if outcome.outcome == "ok":
            self.switch_seconds.labels("drain").observe(outcome.drain_s)
            self.switch_seconds.labels("migrate").observe(outcome.migrate_s)
            self.switch_seconds.labels("total").observe(outcome.total_s)

    def refresh(self, registry: WorkerRegistry, directory: DirectoryStatus) -> None:
        """Copy live gauges from the registry and the directory's `stats()` (called per scrape)."""
        for node in registry.nodes():
            self.queue.labels(node.node_id).set(node.num_waiting)
            self.running.labels(node.node_id).set(max(node.num_running, node.inflight))
            self.healthy.labels(node.node_id).set(1 if node.healthy else 0)
            self.engine_dead.labels(node.node_id).set(1 if node.engine in ("dead", "restarting") else 0)
            self.engine_restarts.labels(node.node_id).set(node.engine_restarts)
            self.restarts.labels(node.node_id).set(node.restarts)
            for phase in Phase:
                self.phase.labels(node.node_id, phase.value).set(1 if node.phase is phase else 0)
        self._kv_peers.nodes = [(node.node_id, node.kv_peers, node.block_bytes) for node in registry.nodes()]
        self.pool_hit_rate.set(directory.hit_rate)
        self.directory_blocks.set(directory.blocks)
        self.directory_referenced.set(directory.referenced)
        self.directory_branches.set(directory.branches)

    def refresh_planner(self, decision: Decision | None) -> None:
        """The last decision's predicted throughput of the chosen and the current split (called per scrape)."""
        if decision is None:
            return
        by_split = {(p.prefill_nodes, p.decode_nodes): p for p in decision.predictions}
        for name, split in (("chosen", decision.chosen_split), ("current", decision.current_split)):
            prediction = by_split.get(split)
            if prediction is not None:
                self.planner_predicted.labels(name).set(prediction.throughput_rps)
        self.planner_confidence.set(decision.confidence)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
