"""`evolving-infra testbed ...`: the cluster as separate hosts on one machine.

    evolving-infra testbed up [--workers 2] [--prefill 1] [--model DIR] [--port 0]
    evolving-infra testbed link HOST down|up [--rate 20mbit|off]
    evolving-infra testbed status
    evolving-infra testbed cleanup

`up` builds the namespaces (gateway host `gw`, worker hosts `w1`..`wN`),
relays Redis and PostgreSQL into each host's loopback, starts the workers
(UCX limited to TCP on the host's eth0) and the gateway inside their hosts,
makes the gateway reachable at the root's 127.0.0.1:<port>, prints how to
use it, and waits; Ctrl-C or SIGTERM removes everything it created. `link`
pulls or plugs a host's cable of the live testbed (or caps its rate);
`cleanup` removes a crashed run's leftovers. All need root.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import sys
import time

from cli.testbed import netns
from cli.testbed.plan import Layout, plan_layout

DEFAULT_PREFIX = "ei-tb"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evolving-infra testbed", description=__doc__.split("\n\n")[0])
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="names of everything the testbed creates")
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="build the hosts, start workers and gateway, wait")
    up.add_argument("--workers", type=int, default=2)
    up.add_argument("--prefill", type=int, default=None, help="prefill workers (default: N // 2)")
    up.add_argument("--model", default="data/demo-model")
    up.add_argument("--port", type=int, default=0, help="root-namespace port of the gateway (0: a free one)")
    up.add_argument("--data-dir", default="data/testbed", help="logs, run folders and the gateway's store")
    up.add_argument("--kv-pull-timeout-s", type=float, default=3.0)
    up.add_argument("--db-url", default=None, help="the gateway's EVOLVING_DB_URL (127.0.0.1 is relayed)")
    up.add_argument("--directory-url", default=None, help="the gateway's EVOLVING_DIRECTORY_URL (Redis)")
    link = sub.add_parser("link", help="pull or plug a host's cable of the live testbed")
    link.add_argument("host")
    link.add_argument("state", choices=["up", "down"])
    link.add_argument("--rate", default=None, help="cap the host's sending rate (tc tbf, e.g. 20mbit); off: lift")
    sub.add_parser("status", help="the live testbed's hosts and processes")
    sub.add_parser("cleanup", help="remove a crashed run's namespaces")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reason = netns.unavailable_reason(args.prefix)
    if reason:
        print(f"evolving-infra testbed: {reason}", file=sys.stderr)
        return 2
    if args.action == "cleanup":
        print("removed:", ", ".join(netns.cleanup(args.prefix)) or "nothing")
        return 0
    if args.action in ("status", "link"):
        layout = _live_layout(args.prefix)
        if layout is None:
            print(f"no live testbed with prefix {args.prefix!r}", file=sys.stderr)
            return 1
        return _status(layout) if args.action == "status" else _link(args, layout)
    return _up(args)


def _live_layout(prefix: str) -> Layout | None:
    state = netns.RUN / prefix / "state.json"
    if not state.exists():
        return None
    body = json.loads(state.read_text())
    hosts = [h["name"] for h in body["hosts"]]
    subnet = body["hosts"][0]["addr"].rsplit(".", 1)[0] + ".0/24"
    return plan_layout(prefix, hosts, subnet)


def _status(layout: Layout) -> int:
    for h in layout.hosts:
        print(f"{h.name:6} {h.netns:16} {h.addr:14} pids {netns.netns_pids(h.netns)}")
    return 0


def _link(args: argparse.Namespace, layout: Layout) -> int:
    tb = netns.Testbed([h.name for h in layout.hosts], prefix=layout.prefix)  # not brought up: names only
    tb.layout = layout
    tb.set_link(args.host, args.state == "up")
    if args.rate:
        tb.limit_rate(args.host, None if args.rate == "off" else args.rate)
    print(f"{args.host}: link {args.state}" + (f", rate {args.rate}" if args.rate else ""))
    return 0


def _up(args: argparse.Namespace) -> int:
    from cli.demo_key import demo_key
    from cli.startup_text import SNIPPET
    from cli.testbed.cluster import Cluster
    from cli.testbed.relay import expose, relay_services
    from gateway.compose import ControlPlane
    from gateway.settings import GatewaySettings

    if args.workers < 1:
        raise SystemExit("--workers must be >= 1")
    n_prefill = args.workers // 2 if args.prefill is None else args.prefill
    workers = [f"w{i + 1}" for i in range(args.workers)]
    data = pathlib.Path(args.data_dir).resolve()
    cpus = os.cpu_count() or 1
    with netns.Testbed(["gw", *workers], prefix=args.prefix) as tb:
        relay_services(tb)
        cluster = Cluster(tb, args.model, secrets.token_urlsafe(24), data / "logs", data / "run")
        nodes = [
            cluster.add_worker(
                host,
                host,
                "prefill" if i < n_prefill else "decode",
                cpu=str(i % cpus),
                args=["--kv-pull-timeout-s", str(args.kv_pull_timeout_s)],
            )
            for i, host in enumerate(workers)
        ]
        for n in nodes:
            cluster.start(n)
        print(f"starting {len(nodes)} workers in their hosts; logs in {data / 'logs'}", flush=True)
        cluster.wait_ready(nodes)
        gw_env = {
            k: v for k, v in (("EVOLVING_DB_URL", args.db_url), ("EVOLVING_DIRECTORY_URL", args.directory_url)) if v
        }
        gateway = cluster.add_gateway("gw", [n.url for n in nodes], env=gw_env)
        settings = GatewaySettings.from_env(
            {**os.environ, **gw_env}, model_dir=args.model, data_dir=str(data / "run" / "gateway")
        )
        key = demo_key(ControlPlane.build(settings), settings.data_dir).secret or "sk-local"
        cluster.start(gateway)
        cluster.wait_ready([gateway])
        url = f"http://127.0.0.1:{expose(tb, 'gw', 8000, args.port).port}"
        for h in tb.layout.hosts:
            print(f"  host {h.name:4} {h.netns:14} {h.addr}")
        print(f"gateway: {url}/v1 (relayed into {gateway.url}); metrics {url}/metrics")
        print(f"pull a cable: evolving-infra testbed link w1 down   (plug: ... up)   prefix {args.prefix}")
        print("try it:\n" + SNIPPET.format(url=url, key=key, model=settings.served_model), flush=True)
        try:
            while all(p.alive for p in cluster.procs.values()):
                time.sleep(1.0)
            print("a process of the testbed exited; see the logs", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            print("removing the testbed...", flush=True)
