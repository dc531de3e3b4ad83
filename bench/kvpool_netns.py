"""`bench kvpool --hosts netns --json`: the KV pool across hosts on one machine.

Hosts are network namespaces (cli/testbed): `gw` (this client, the
gateway's seat), `w1`, `w2`; UCX is limited to TCP on each host's eth0, so
no shared memory or CMA can carry a block.

1. Reads: a peer process in w1 serves filled stores; a reader in gw (a
   thread inside gw's namespace, so every socket UCX opens is gw's) runs the
   cases of `bench kvpool` against in-process memcpy. What UCX used is read
   back from UCX's own log (the endpoint's lanes, the READ protocol) and
   checked against the bytes w1's cable carried.
2. Real workers: vLLM worker A (w1, prefill) and B (w2, decode):
   `bench disagg`'s disaggregation and live migration across hosts, token
   for token; then the faults of bench/xhost_faults.py.

Prints one JSON object: {"transport", "hosts", "ucx_tls", "results",
"ucx_transport", "link_bytes", "disagg_identical", "migration_identical",
"disagg", "faults", "fault_details", "read_deadline_s", "targets_met"}.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from cli.testbed.netns import Testbed, unavailable_reason
from cli.testbed.plan import NETWORK_UCX_ENV, parse_ucx_transport

PREFIX = "ei-tb-b"
# (descriptor file, cases, region bytes, seconds, rounds) -> result rows
Reader = Callable[[str, Sequence[Any], int, float, int], list[Any]]


def _reads(
    tb: Testbed, log_dir: pathlib.Path, read: Reader, cases: Sequence, seconds: float, rounds: int, region: int
) -> dict:
    """Part 1: the peer in w1, this process reading from gw (`read`: bench.kvpool_bench.read_from_file)."""
    desc = tb.run_dir / "peer-descriptors.json"
    argv = [sys.executable, "-m", "bench.kvpool_bench", "--serve-peer", str(desc), "--region-mib", str(region >> 20)]
    if any(getattr(c, "scattered", False) for c in cases):
        argv.append("--scattered")
    peer_env = {**NETWORK_UCX_ENV, "UCX_LOG_LEVEL": "info"}
    with open(log_dir / "peer.log", "wb") as out:
        peer = tb.popen("w1", argv, env=peer_env, stdout=out, stderr=subprocess.STDOUT, cwd=_repo())
    try:
        before = tb.link_bytes("w1")
        results = tb.call_in("gw", read, str(desc), cases, region, seconds, rounds)
        after = tb.link_bytes("w1")
    finally:
        peer.terminate()
        peer.wait(30)
    read_bytes = sum(r["reads"] * r["block_bytes"] * r["blocks_per_read"] for r in results)
    sent = after["tx_bytes"] - before["tx_bytes"]
    ucx = parse_ucx_transport((log_dir / "reader-ucx.log").read_text(errors="replace"))
    return {
        "results": results,
        "ucx_transport": None if ucx is None else {**ucx.__dict__, "shared_memory_free": ucx.shared_memory_free},
        # At least every byte timed (plus connection setup, tags and the verification reads) crossed the cable.
        "link_bytes": {
            "timed_reads": read_bytes,
            "peer_sent": sent,
            "sent_over_read": round(sent / max(read_bytes, 1), 3),
        },
    }


def _repo() -> str:
    return str(pathlib.Path(__file__).resolve().parents[1])


def _workers(tb: Testbed, args: argparse.Namespace, log_dir: pathlib.Path) -> dict:
    """Part 2: real vLLM workers in w1 and w2; the client in gw."""
    from bench import disagg_bench
    from bench._kvbench import use_cluster_token
    from cli.testbed.cluster import Cluster
    from testing.cross_host import fault_suite, start_pair

    cluster = Cluster(
        tb, args.model, secrets.token_urlsafe(16), log_dir, pathlib.Path(tempfile.mkdtemp(prefix="ei-tb-run-"))
    )
    t0 = time.monotonic()
    a, b = start_pair(cluster, "dgA", "dgB", read_deadline_s=args.pull_timeout_s)
    cluster.wait_ready([a, b])
    out: dict[str, Any] = {"workers_start_s": round(time.monotonic() - t0, 1)}
    use_cluster_token(cluster.token)  # the workers bind beyond loopback
    disagg = tb.call_in(
        "gw",
        disagg_bench.run_bench,
        a.url,
        b.url,
        prompt_tokens=500,
        output_tokens=32,
        migration_output_tokens=args.migration_output_tokens,
        verify_after=64,
    )
    out["disagg"] = disagg
    out["disagg_identical"] = bool(disagg["identical_tokens"] and disagg["decode_computed_fraction"] <= 0.10)
    out["migration_identical"] = bool(disagg["migration_identical_tokens"])

    suite = fault_suite(cluster, a, b)
    details = tb.call_in("gw", suite.run)
    out["faults"] = suite.summary(details)
    out["fault_details"] = details
    ucx = cluster.ucx_transport("dgB")
    out["workers_ucx_transport"] = (
        None if ucx is None else {**ucx.__dict__, "shared_memory_free": ucx.shared_memory_free}
    )
    return out


def main(argv: list[str], *, read: Reader, cases: Sequence, seconds: float, rounds: int, region_bytes: int) -> int:
    """`read` is passed in by bench.kvpool_bench, which dispatches here (no import back: no cycle)."""
    p = argparse.ArgumentParser(prog="evolving-infra bench kvpool --hosts netns")
    p.add_argument("--model", default="data/demo-model")
    p.add_argument("--pull-timeout-s", type=float, default=2.0, help="the workers' read deadline")
    p.add_argument("--migration-output-tokens", type=int, default=2000)
    p.add_argument("--reads-only", action="store_true", help="skip the real workers (disaggregation, faults)")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--prefix", default=PREFIX)
    args = p.parse_args(argv)
    reason = unavailable_reason(args.prefix)
    if reason:
        print(json.dumps({"transport": "nixl", "hosts": "netns", "error": reason}))
        return 2
    log_dir = pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="ei-tb-bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    # This process's own UCX (the reader's) follows the hosts' settings; its log is read back.
    os.environ.update(NETWORK_UCX_ENV)
    os.environ.update(UCX_LOG_LEVEL="info", UCX_PROTO_INFO="y", UCX_LOG_FILE=str(log_dir / "reader-ucx.log"))
    out: dict[str, Any] = {"transport": "nixl", "hosts": "netns", "ucx_tls": NETWORK_UCX_ENV["UCX_TLS"]}
    with Testbed(["gw", "w1", "w2"], prefix=args.prefix) as tb:
        out.update(_reads(tb, log_dir, read, cases, seconds, rounds, region_bytes))
        if not args.reads_only:
            out["read_deadline_s"] = args.pull_timeout_s
            out.update(_workers(tb, args, log_dir))
    out["log_dir"] = str(log_dir)
    if not args.reads_only:
        f = out["faults"]
        out["targets_met"] = bool(
            out["disagg_identical"]
            and out["migration_identical"]
            and f["lost"] == 0
            and f["duplicated_tokens"] == 0
            and f["identical"]
            and f["reconnected"]
            and f["max_stall_s"] <= args.pull_timeout_s + 1.0
            and (out["ucx_transport"] or {}).get("shared_memory_free", False)
        )
    print(json.dumps(out))
    return 0 if out.get("targets_met", True) else 1
