"""Two real vLLM workers across hosts of the testbed, and the network
faults of bench/xhost_faults.py against them: the steps `bench kvpool
--hosts netns` and tests/integration/test_testbed_vllm.py share.

Worker A runs in host w1 (prefill, CPU 0) and worker B in host w2 (decode,
CPU 1), each with the given KV read deadline; the faults act on A: its
cable and sending rate (w1's eth0) and its process (SIGKILL, start again).
The caller runs what talks to them from host gw (`Testbed.call_in`).
"""

from __future__ import annotations

from bench.xhost_faults import FaultHooks, FaultSuite
from cli.testbed.cluster import Cluster, Proc


def start_pair(cluster: Cluster, node_a: str, node_b: str, *, read_deadline_s: float) -> tuple[Proc, Proc]:
    """A and B added to `cluster` and started; not yet ready (`cluster.wait_ready`)."""
    args = ["--kv-pull-timeout-s", str(read_deadline_s)]
    a = cluster.add_worker("w1", node_a, "prefill", cpu="0", args=args)
    b = cluster.add_worker("w2", node_b, "decode", cpu="1", args=args)
    for p in (a, b):
        cluster.start(p)
    return a, b


def fault_suite(cluster: Cluster, a: Proc, b: Proc) -> FaultSuite:
    """bench/xhost_faults.py's suite, its hooks wired to A's host and process.
    The caller restores A's link afterwards if a fault may have been left on."""
    tb = cluster.tb

    def restart_a() -> None:
        cluster.start(a)
        cluster.wait_ready([a])

    hooks = FaultHooks(
        cut=lambda up: tb.set_link("w1", up),
        limit=lambda rate: tb.limit_rate("w1", rate),
        a_tx_bytes=lambda: tb.link_bytes("w1")["tx_bytes"],
        kill_a=lambda: cluster.kill(a),
        restart_a=restart_a,
    )
    return FaultSuite(a.url, b.url, a.name, hooks)
