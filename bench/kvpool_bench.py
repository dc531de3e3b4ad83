"""`bench kvpool`: NIXL block fetch between two processes vs in-process memcpy.

A spawned peer process owns a filled HostBlockStore per block size and serves
one-sided reads (it only pumps NIXL progress). This process reads one block
per request, cycling over a 256 MiB region on both sides so neither the fetch
nor the memcpy is served from a warm cache, and copies the same sizes with
numpy (one memcpy) between two stores of its own, in interleaved rounds. Both numbers include Python's per-call
cost; the fetch also includes the tag read that guards against slot reuse.

Run: `python -m bench.kvpool_bench` (prints one JSON object).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from kvpool.store import HostBlockStore, StoreConfig

KIB, MIB = 1 << 10, 1 << 20
DEFAULT_SIZES = (64 * KIB, MIB, 16 * MIB)


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
    from kvpool.transport.nixl import NixlTransport, NixlTransportConfig

    served = []
    for i, (block_bytes, capacity) in enumerate(specs):
        node_id = f"{node_prefix}-{i}-{block_bytes}"
        store = HostBlockStore(StoreConfig(block_bytes, capacity))
        hashes = fill_store(store, node_id)
        pump = 0.002 if pumps is None or pumps[i] else None
        transport = NixlTransport(node_id, store, NixlTransportConfig(progress_interval_s=pump))
        served.append((node_id, store, transport, hashes))
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


def _rate(
    fn: Callable[[int], object], block_bytes: int, n_slots: int, cursor: int, min_s: float, min_reps: int
) -> tuple[float, int]:
    """Bytes/s of fn(slot) over consecutive slots from cursor; returns (rate, new cursor)."""
    reps, start = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < min_s:
        fn((cursor + reps) % n_slots)
        reps += 1
    return block_bytes * reps / (time.perf_counter() - start), cursor + reps


def run_kvpool_bench(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    region_bytes: int = 256 * MIB,
    min_seconds: float = 1.0,
    rounds: int = 5,
) -> dict[str, Any]:
    """Measure and return {"transport": "nixl", "results": [...]} (see module doc)."""
    from kvpool.transport.nixl import NixlTransport

    specs = [(bb, max(4, region_bytes // bb)) for bb in sizes]
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    peer = ctx.Process(target=serve_peer, args=(theirs, "bench-peer", specs), daemon=True)
    peer.start()
    results = []
    try:
        served = ours.recv()
        for (bb, cap), (peer_id, descriptor, hashes) in zip(specs, served, strict=False):
            local = HostBlockStore(StoreConfig(bb, cap))
            src = HostBlockStore(StoreConfig(bb, cap))
            transport = NixlTransport("bench-reader", local)
            try:
                transport.add_peer(peer_id, descriptor)
                transport.read_blocks_sync(peer_id, [0], [0])  # connection setup
                dst, srcs = local.data.numpy(), src.data.numpy()
                pool_rates, copy_rates, cur_p, cur_m = [], [], 0, 0
                # Interleaved rounds, median of each: the host may be shared.
                for _ in range(rounds):
                    rate, cur_p = _rate(
                        lambda i, t=transport, p=peer_id: t.read_blocks_sync(p, [i], [i]),
                        bb,
                        cap,
                        cur_p,
                        min_seconds / rounds,
                        4,
                    )
                    pool_rates.append(rate)
                    rate, cur_m = _rate(
                        lambda i, d=dst, s=srcs: np.copyto(d[i], s[i]), bb, cap, cur_m, min_seconds / rounds, 4
                    )
                    copy_rates.append(rate)
                transport.read_blocks_sync(peer_id, [1], [1])
                ok = bool(local.data[1, 0].item() == 1)
                ok = ok and bytes(local.tags[1].numpy()) == bytes.fromhex(hashes[1])
                pool, memcpy = statistics.median(pool_rates), statistics.median(copy_rates)
                results.append(
                    {
                        "block_bytes": bb,
                        "pool_gbps": round(pool / 1e9, 3),
                        "memcpy_gbps": round(memcpy / 1e9, 3),
                        "ratio": round(pool / memcpy, 3),
                        "blocks_per_read": 1,
                        "reads": cur_p,
                        "verified": ok,
                    }
                )
            finally:
                transport.close()
        ours.send(("exit",))
        peer.join(timeout=10)
    finally:
        if peer.is_alive():
            peer.kill()
    return {"transport": "nixl", "results": results}


def main() -> None:
    print(json.dumps(run_kvpool_bench()))


if __name__ == "__main__":
    main()
