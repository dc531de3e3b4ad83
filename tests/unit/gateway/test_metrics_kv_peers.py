"""GatewayMetrics exports the workers' KV pull counters per (node, peer), node health and the directory."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from core import Phase
from gateway.kv.views import DirectoryStatus
from gateway.metrics import GatewayMetrics
from workers.protocol import KVPeerStats


def _samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics.render()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_kv_peer_counters_and_state_of_the_last_heartbeat() -> None:
    down = KVPeerStats(peer="wA", state="down", reason="timeout", pulls={"ok": 3, "timeout": 1}, blocks=45, downs=1)
    node = SimpleNamespace(
        node_id="wB",
        num_waiting=0,
        num_running=0,
        inflight=0,
        healthy=True,
        phase=Phase.DECODE,
        kv_peers=(down,),
        engine="alive",
        restarts=0,
        engine_restarts=0,
        block_bytes=1024,
    )
    registry = SimpleNamespace(nodes=lambda: [node])
    directory = DirectoryStatus()
    metrics = GatewayMetrics()
    metrics.refresh(registry, directory)  # type: ignore[arg-type]  # a stand-in registry
    got = _samples(metrics)
    assert got[("evolving_kv_pulls_total", (("node", "wB"), ("outcome", "ok"), ("peer", "wA")))] == 3
    assert got[("evolving_kv_pulls_total", (("node", "wB"), ("outcome", "timeout"), ("peer", "wA")))] == 1
    assert got[("evolving_kv_pulled_blocks_total", (("node", "wB"), ("peer", "wA")))] == 45
    assert got[("evolving_kv_peer_up", (("node", "wB"), ("peer", "wA")))] == 0
    assert got[("evolving_kv_peer_downs_total", (("node", "wB"), ("peer", "wA")))] == 1
    node.kv_peers = (down.model_copy(update={"state": "up"}),)
    metrics.refresh(registry, directory)  # type: ignore[arg-type]  # a stand-in registry
    assert _samples(metrics)[("evolving_kv_peer_up", (("node", "wB"), ("peer", "wA")))] == 1


def test_engine_dead_and_restarts_per_node() -> None:
    node = SimpleNamespace(
        node_id="wB",
        num_waiting=0,
        num_running=0,
        inflight=0,
        healthy=False,
        phase=Phase.DECODE,
        kv_peers=(),
        engine="restarting",
        restarts=2,
        engine_restarts=3,
        block_bytes=1024,
    )
    metrics = GatewayMetrics()
    directory = DirectoryStatus(blocks=12, bytes=12 * 1024, referenced=5, branches=2, hit_rate=0.25)
    metrics.refresh(SimpleNamespace(nodes=lambda: [node]), directory)  # type: ignore[arg-type]  # a stand-in registry
    got = _samples(metrics)
    assert got[("evolving_directory_blocks", ())] == 12 and got[("evolving_directory_referenced_blocks", ())] == 5
    assert got[("evolving_directory_branches", ())] == 2 and got[("evolving_pool_hit_rate", ())] == 0.25
    assert got[("evolving_node_engine_dead", (("node", "wB"),))] == 1  # restarting in place: still not serving
    assert got[("evolving_node_restarts", (("node", "wB"),))] == 2
    assert got[("evolving_node_engine_restarts", (("node", "wB"),))] == 3
    assert got[("evolving_node_healthy", (("node", "wB"),))] == 0
