"""`bench kvpool`: NIXL block reads between two processes vs in-process memcpy.

A peer process owns a filled HostBlockStore per block size and serves reads
(its NIXL progress thread answers them). This process reads, cycling over a
256 MiB region on both sides so neither the read nor the memcpy is served
from a warm cache, and copies the same bytes with numpy between two stores
of its own (the source written first: an unwritten huge-page region maps
the shared zero page, and a memcpy from it reads from cache), in interleaved
rounds. Cases: one block per read at 64 KiB, 1 MiB and 16 MiB, and 64
blocks of 64 KiB in one read (`blocks_per_read` 64; the memcpy reference
copies them one by one, as the connector's blocks are separate). Both
numbers include Python's per-call cost; the read also includes the tag read
that guards against slot reuse. `ratio` is the median over rounds of wall
rates; `ratio_per_call` the ratio of median per-call times (steadier when
the host is shared).

Run: `evolving-infra bench kvpool --json` (one host; prints one JSON object),
`evolving-infra bench kvpool --hosts netns --json` (across network
namespaces, with the fault suite: bench/kvpool_netns.py; needs root).
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import pathlib
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from kvpool.store import HostBlockStore, StoreConfig

KIB, MIB = 1 << 10, 1 << 20
REGION_BYTES = 256 * MIB


@dataclass(frozen=True)
class Case:
    block_bytes: int
    blocks_per_read: int = 1
    scattered: bool = False  # the batch's slots spread over the region, no two adjacent


DEFAULT_CASES = (Case(64 * KIB), Case(MIB), Case(16 * MIB), Case(64 * KIB, 64))


def fill_store(store: HostBlockStore, prefix: str) -> list[str]:
    """Fill every slot with a deterministic pattern; return the hashes by slot."""
    from kvpool.hashing import block_hashes

    n = store.capacity_blocks
    hashes = block_hashes(list(range(n)), 1, prefix)
    slots = store.allocate(hashes)
    assert slots == list(range(n)), "a fresh store allocates slots in order"
    pattern = torch.arange(store.block_bytes, dtype=torch.int64).to(torch.uint8)
    store.data.copy_(pattern.expand(n, -1))
    store.data[:, 0] = torch.arange(n, dtype=torch.int64).to(torch.uint8)
    store.commit(list(range(n)))
    return hashes


def _served_stores(node_prefix: str, specs: list[tuple[int, int]], pumps: Sequence[bool] | None) -> list[tuple]:
    from kvpool.transport.nixl import NixlTransport, NixlTransportConfig

    served = []
    for i, (block_bytes, capacity) in enumerate(specs):
        node_id = f"{node_prefix}-{i}-{block_bytes}"
        store = HostBlockStore(StoreConfig(block_bytes, capacity))
        hashes = fill_store(store, node_id)
        progress = "thread" if pumps is None or pumps[i] else "none"
        transport = NixlTransport(node_id, store, NixlTransportConfig(progress=progress))
        served.append((node_id, store, transport, hashes))
    return served


def serve_peer(
    conn: Connection, node_prefix: str, specs: list[tuple[int, int]], pumps: Sequence[bool] | None = None
) -> None:
    """Worker-like peer: one store + NIXL transport per (block_bytes, capacity).

    pumps[i] False: that store's transport makes no progress on its own (a
    peer that never answers connection setup; tests use it for timeouts).

    Sends [(node_id, descriptor, hashes)]; then serves commands until "exit":
    ("drop", index, hashes) drops blocks; ("refill", index, hashes) re-puts them
    with another pattern into the freed slots (to test slot reuse).
    """
    served = _served_stores(node_prefix, specs, pumps)
    conn.send([(n, t.local_descriptor(), h) for n, _, t, h in served])
    while True:
        cmd = conn.recv()
        if cmd[0] == "exit":
            break
        _, index, hashes = cmd
        store = served[index][1]
        if cmd[0] == "drop":
            conn.send(store.drop(hashes))
        elif cmd[0] == "refill":
            conn.send([store.put(h, torch.full((store.block_bytes,), 7, dtype=torch.uint8)) for h in hashes])
    for _, _, transport, _ in served:
        transport.close()


def serve_peer_file(path: str, node_prefix: str, specs: list[tuple[int, int]]) -> None:
    """The peer of a run across hosts: writes [(node_id, descriptor b64,
    hashes)] as JSON to `path` (atomically), then serves until SIGTERM."""
    served = _served_stores(node_prefix, specs, None)
    body = [(n, base64.b64encode(t.local_descriptor()).decode(), h) for n, _, t, h in served]
    tmp = pathlib.Path(path + ".tmp")
    tmp.write_text(json.dumps(body))
    tmp.rename(path)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    for _, _, transport, _ in served:
        transport.close()


def _rate(
    fn: Callable[[int], object], nbytes: int, n: int, cursor: int, min_s: float, min_reps: int, calls: list[int]
) -> tuple[float, int]:
    """Bytes/s of fn(k) over consecutive k from cursor (mod n); per-call ns go to `calls`."""
    clock = time.perf_counter_ns
    reps, start = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < min_s:
        c0 = clock()
        fn((cursor + reps) % n)
        calls.append(clock() - c0)
        reps += 1
    return nbytes * reps / (time.perf_counter() - start), cursor + reps


def _groups(cap: int, per_read: int, scattered: bool) -> list[list[int]]:
    n = cap // per_read
    if scattered:  # group k: k, k + n, k + 2n, ...
        return [[k + j * n for j in range(per_read)] for k in range(n)]
    return [list(range(k * per_read, (k + 1) * per_read)) for k in range(n)]


def measure_case(
    transport: Any, peer_id: str, hashes: list[str], case: Case, min_seconds: float, rounds: int
) -> dict[str, Any]:
    """Reads of `case` from `peer_id` (already added and connected) into the
    transport's store, against memcpy of the same bytes: one result row."""
    local: HostBlockStore = transport.store
    bb, per, cap = case.block_bytes, case.blocks_per_read, transport.store.capacity_blocks
    src = HostBlockStore(StoreConfig(bb, cap))
    src.data.copy_(torch.arange(bb, dtype=torch.int64).to(torch.uint8).expand(cap, -1))
    local.data.fill_(1)  # touch every page before timing
    groups = _groups(cap, per, case.scattered)
    dst, srcs = local.data.numpy(), src.data.numpy()

    def read(k: int) -> None:
        transport.read_blocks_sync(peer_id, groups[k], groups[k])

    def copy(k: int) -> None:
        for slot in groups[k]:
            np.copyto(dst[slot], srcs[slot])

    pool_rates: list[float] = []
    copy_rates: list[float] = []
    pool_calls: list[int] = []
    copy_calls: list[int] = []
    cur_p = cur_m = 0
    for _ in range(rounds):  # interleaved: the host may be shared
        rate, cur_p = _rate(read, bb * per, len(groups), cur_p, min_seconds / rounds, 4, pool_calls)
        pool_rates.append(rate)
        rate, cur_m = _rate(copy, bb * per, len(groups), cur_m, min_seconds / rounds, 4, copy_calls)
        copy_rates.append(rate)
    probe = groups[1 % len(groups)]
    local.data[probe] = 0
    transport.read_blocks_sync(peer_id, probe, probe)
    ok = all(
        local.data[s, 0].item() == s % 256 and bytes(local.tags[s].numpy()) == bytes.fromhex(hashes[s]) for s in probe
    )
    pool, memcpy = statistics.median(pool_rates), statistics.median(copy_rates)
    return {
        "block_bytes": bb,
        "pool_gbps": round(pool / 1e9, 3),
        "memcpy_gbps": round(memcpy / 1e9, 3),
        "ratio": round(pool / memcpy, 3),
        "ratio_per_call": round(statistics.median(copy_calls) / statistics.median(pool_calls), 3),
        "read_us_p50": round(statistics.median(pool_calls) / 1e3, 1),
        "blocks_per_read": per,
        "scattered": case.scattered,
        "reads": cur_p,
        "verified": ok,
    }


def read_cases(
    served: dict[int, tuple[str, bytes, list[str]]],
    cases: Sequence[Case],
    region_bytes: int,
    min_seconds: float,
    rounds: int,
) -> list[dict[str, Any]]:
    """Every case against the peer's stores {block_bytes: (node_id, descriptor, hashes)}."""
    from kvpool.transport.nixl import NixlTransport

    results = []
    for case in cases:
        peer_id, descriptor, hashes = served[case.block_bytes]
        store = HostBlockStore(StoreConfig(case.block_bytes, capacity_of(case.block_bytes, region_bytes)))
        transport = NixlTransport("bench-reader", store)
        try:
            transport.add_peer(peer_id, descriptor)
            transport.read_blocks_sync(peer_id, [0], [0])  # connection setup
            results.append(measure_case(transport, peer_id, hashes, case, min_seconds, rounds))
        finally:
            transport.close()
    return results


def capacity_of(block_bytes: int, region_bytes: int = REGION_BYTES) -> int:
    return max(4, region_bytes // block_bytes)


def peer_specs(cases: Sequence[Case], region_bytes: int = REGION_BYTES) -> list[tuple[int, int]]:
    return [(bb, capacity_of(bb, region_bytes)) for bb in sorted({c.block_bytes for c in cases})]


def run_kvpool_bench(
    cases: Sequence[Case] = DEFAULT_CASES,
    region_bytes: int = REGION_BYTES,
    min_seconds: float = 1.0,
    rounds: int = 5,
) -> dict[str, Any]:
    """One host: measure and return {"transport": "nixl", "results": [...]} (see module doc)."""
    specs = peer_specs(cases, region_bytes)
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    peer = ctx.Process(target=serve_peer, args=(theirs, "bench-peer", specs), daemon=True)
    peer.start()
    try:
        served = {bb: s for (bb, _), s in zip(specs, ours.recv(), strict=True)}
        results = read_cases(served, cases, region_bytes, min_seconds, rounds)
        ours.send(("exit",))
        peer.join(timeout=10)
    finally:
        if peer.is_alive():
            peer.kill()
    return {"transport": "nixl", "results": results}


def read_from_file(path: str, cases: Sequence[Case], region_bytes: int, min_seconds: float, rounds: int) -> list:
    """The reader of a run across hosts: the peer's descriptors from `path` (serve_peer_file)."""
    deadline = time.monotonic() + 120
    while not pathlib.Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no peer descriptors at {path}")
        time.sleep(0.1)
    body = json.loads(pathlib.Path(path).read_text())
    served = {}
    for node_id, desc_b64, hashes in body:
        bb = int(node_id.rsplit("-", 1)[1])
        served[bb] = (node_id, base64.b64decode(desc_b64), hashes)
    return read_cases(served, cases, region_bytes, min_seconds, rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench kvpool")
    p.add_argument("--hosts", choices=["local", "netns"], default="local", help="netns: across network namespaces")
    p.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    p.add_argument("--seconds", type=float, default=1.0, help="per case, split over the rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--region-mib", type=int, default=REGION_BYTES // MIB)
    p.add_argument("--scattered", action="store_true", help="also a batch of 64 KiB blocks spread over the region")
    # Roles of a run across hosts (bench/kvpool_netns.py starts them inside namespaces).
    p.add_argument("--serve-peer", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--read-from", metavar="PATH", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    cases = [*DEFAULT_CASES, *([Case(64 * KIB, 64, scattered=True)] if args.scattered else [])]
    region = args.region_mib * MIB
    if args.serve_peer:
        serve_peer_file(args.serve_peer, "xpeer", peer_specs(cases, region))
        return 0
    if args.read_from:
        print(json.dumps(read_from_file(args.read_from, cases, region, args.seconds, args.rounds)))
        return 0
    if args.hosts == "netns":
        from bench import kvpool_netns

        return kvpool_netns.main(
            rest, read=read_from_file, cases=cases, seconds=args.seconds, rounds=args.rounds, region_bytes=region
        )
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    print(json.dumps(run_kvpool_bench(cases, region, args.seconds, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
