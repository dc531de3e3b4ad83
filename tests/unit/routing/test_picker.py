"""Pure routing: scorers with literal values, picker decisions."""

from __future__ import annotations

import pytest

from core.phase import Phase
from routing import NodeLoad, RouterConfig, RouteRequest, route
from routing.picker import NoNodeAvailable, within_load_slack, within_queue_slack
from routing.scorers import free_kv, prefix_locality, queue_load


def test_prefix_locality_is_cached_fraction_capped_at_one():
    req = RouteRequest(prompt_tokens=100, cached_by_node={"a": 50, "b": 200})
    assert prefix_locality(req, NodeLoad("a", Phase.DECODE)) == 0.5
    assert prefix_locality(req, NodeLoad("b", Phase.DECODE)) == 1.0
    assert prefix_locality(req, NodeLoad("c", Phase.DECODE)) == 0.0
    assert prefix_locality(RouteRequest(prompt_tokens=0), NodeLoad("a", Phase.DECODE)) == 0.0


def test_queue_load_and_free_kv():
    assert queue_load(NodeLoad("a", Phase.DECODE)) == 1.0
    assert queue_load(NodeLoad("a", Phase.DECODE, queue=2, running=2), load_scale=4.0) == 0.5
    assert free_kv(NodeLoad("a", Phase.DECODE, kv_usage=0.25)) == 0.75
    assert free_kv(NodeLoad("a", Phase.DECODE, kv_usage=1.5)) == 0.0


def test_short_uncached_suffix_stays_on_decode_node():
    nodes = [NodeLoad("p", Phase.PREFILL), NodeLoad("d", Phase.DECODE)]
    req = RouteRequest(prompt_tokens=1000, cached_by_node={"d": 900}, pool_cached_tokens=900)
    d = route(req, nodes, RouterConfig(local_prefill_max_tokens=256))
    assert (d.decode_node, d.prefill_node, d.cached_tokens) == ("d", None, 900)
    assert not d.disaggregated


def test_long_uncached_prompt_is_disaggregated_to_the_local_prefill_node():
    nodes = [NodeLoad("p1", Phase.PREFILL), NodeLoad("p2", Phase.PREFILL), NodeLoad("d", Phase.DECODE)]
    req = RouteRequest(prompt_tokens=2000, cached_by_node={"p1": 1000}, pool_cached_tokens=1000)
    d = route(req, nodes, RouterConfig(local_prefill_max_tokens=256))
    assert d.prefill_node == "p1" and d.decode_node == "d" and d.disaggregated


def test_load_beats_locality_when_the_local_node_is_swamped():
    nodes = [NodeLoad("p1", Phase.PREFILL, queue=40), NodeLoad("p2", Phase.PREFILL), NodeLoad("d", Phase.DECODE)]
    req = RouteRequest(prompt_tokens=2000, cached_by_node={"p1": 200})
    assert route(req, nodes).prefill_node == "p2"


def test_a_cached_system_prompt_does_not_outweigh_a_queue_beyond_the_slack():
    """p1 holds 80 % of the prompt; with 3 in its queue it still beats an
    idle p2 on score (0.6*0.8 + 0.4*4/7 > 0.4), but is 3 above the least
    loaded: filtered out at slack 2, kept at slack 3 or without a bound."""
    nodes = [
        NodeLoad("p1", Phase.PREFILL, queue=2, running=1),
        NodeLoad("p2", Phase.PREFILL),
        NodeLoad("d", Phase.DECODE),
    ]
    req = RouteRequest(prompt_tokens=2000, cached_by_node={"p1": 1600}, pool_cached_tokens=1600)
    assert route(req, nodes, RouterConfig(local_prefill_max_tokens=256)).prefill_node == "p2"
    for slack in (3, None):
        cfg = RouterConfig(local_prefill_max_tokens=256, prefill_load_slack=slack)
        assert route(req, nodes, cfg).prefill_node == "p1"


def test_load_slack_filter_keeps_nodes_within_the_bound():
    nodes = [
        NodeLoad("a", Phase.PREFILL, queue=3),
        NodeLoad("b", Phase.PREFILL, running=1),
        NodeLoad("c", Phase.PREFILL, queue=5),
    ]
    assert [n.node_id for n in within_load_slack(nodes, 2)] == ["a", "b"]
    assert [n.node_id for n in within_load_slack(nodes, 0)] == ["b"]
    assert within_load_slack(nodes, None) == nodes
    with pytest.raises(ValueError, match="prefill_load_slack must be >= 0"):
        RouterConfig(prefill_load_slack=-1)


def test_a_session_leaves_its_decode_node_once_requests_wait_there_beyond_the_slack():
    """d1 holds the session's whole context; at full batches the load score
    barely tells 256 running from 256 running with 40 waiting, so locality
    wins on score. Waiting 3 above the least waiting node, d1 is filtered
    out at slack 2, kept at slack 3 or without a bound."""
    nodes = [
        NodeLoad("d1", Phase.DECODE, queue=3, running=256, kv_usage=0.5),
        NodeLoad("d2", Phase.DECODE, running=256, kv_usage=0.5),
    ]
    req = RouteRequest(prompt_tokens=8000, cached_by_node={"d1": 7900}, pool_cached_tokens=7900)
    assert route(req, nodes).decode_node == "d2"
    for slack in (3, None):
        assert route(req, nodes, RouterConfig(decode_queue_slack=slack)).decode_node == "d1"
    busy = [NodeLoad("d1", Phase.DECODE, queue=40, running=256), NodeLoad("d2", Phase.DECODE, queue=38, running=256)]
    assert route(req, busy).decode_node == "d1"  # both wait: within the slack, locality decides


def test_queue_slack_filter_counts_waiting_requests_only():
    nodes = [
        NodeLoad("a", Phase.DECODE, queue=3),
        NodeLoad("b", Phase.DECODE, running=200),
        NodeLoad("c", Phase.DECODE, queue=2),
    ]
    assert [n.node_id for n in within_queue_slack(nodes, 2)] == ["b", "c"]
    assert [n.node_id for n in within_queue_slack(nodes, 0)] == ["b"]
    assert within_queue_slack(nodes, None) == nodes
    with pytest.raises(ValueError, match="decode_queue_slack must be >= 0"):
        RouterConfig(decode_queue_slack=-1)


def test_decode_prefers_free_kv_and_low_load():
    nodes = [
        NodeLoad("d1", Phase.DECODE, running=8, kv_usage=0.9),
        NodeLoad("d2", Phase.DECODE, running=1, kv_usage=0.1),
    ]
    assert route(RouteRequest(prompt_tokens=10), nodes).decode_node == "d2"


def test_draining_and_unhealthy_nodes_are_skipped():
    nodes = [
        NodeLoad("d1", Phase.DECODE, draining=True),
        NodeLoad("d2", Phase.DECODE, healthy=False),
        NodeLoad("d3", Phase.DECODE, running=50),
    ]
    assert route(RouteRequest(prompt_tokens=10), nodes).decode_node == "d3"


def test_all_prefill_cluster_still_serves_locally():
    nodes = [NodeLoad("p1", Phase.PREFILL), NodeLoad("p2", Phase.PREFILL, running=3)]
    d = route(RouteRequest(prompt_tokens=5000), nodes)
    assert d.decode_node == "p1" and d.prefill_node is None


def test_no_healthy_node_raises():
    with pytest.raises(NoNodeAvailable):
        route(RouteRequest(prompt_tokens=10), [NodeLoad("d", Phase.DECODE, healthy=False)])
    with pytest.raises(NoNodeAvailable):
        route(RouteRequest(prompt_tokens=10), [])


def test_ties_are_broken_deterministically_by_node_id():
    nodes = [NodeLoad("a", Phase.DECODE), NodeLoad("b", Phase.DECODE)]
    assert route(RouteRequest(prompt_tokens=10), nodes).decode_node == "b"


def test_pool_hit_counts_even_when_no_node_holds_it_locally():
    nodes = [NodeLoad("p", Phase.PREFILL), NodeLoad("d", Phase.DECODE)]
    req = RouteRequest(prompt_tokens=1000, cached_by_node={}, pool_cached_tokens=990)
    assert route(req, nodes).prefill_node is None


def test_config_is_validated():
    with pytest.raises(ValueError, match="local_prefill_max_tokens must be >= 0"):
        RouterConfig(local_prefill_max_tokens=-1)
    with pytest.raises(ValueError, match="load_scale must be > 0"):
        RouterConfig(load_scale=0)
