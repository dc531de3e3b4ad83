"""What the gateway shows of the KV directory: its totals and the branches holding most blocks.

Built by `gateway.kv.directory.GatewayDirectory` from kvpool's `DirectoryStats`
and `BranchInfo`; read by the admin API (`GET /admin/cluster`: `directory`,
`top_branches`), the Prometheus gauges and the console. Field names are the
admin API's JSON keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.directory import BranchInfo, DirectoryStats


@dataclass(frozen=True)
class DirectoryStatus:
    """The directory's totals. With the backend unreachable these are the last
    numbers seen (zeros before any), and `available` is False."""

    blocks: int = 0  # distinct blocks held by at least one node
    bytes: int = 0  # sum over nodes of blocks held x that node's block size
    referenced: int = 0  # blocks an active branch references (kept from eviction)
    branches: int = 0  # active branches
    hit_rate: float = 0.0  # cached / looked-up prompt tokens over full blocks, 0..1
    available: bool = True  # the backend answered this call

    @classmethod
    def of(cls, stats: DirectoryStats) -> DirectoryStatus:
        return cls(
            blocks=stats.blocks,
            bytes=stats.bytes,
            referenced=stats.referenced_blocks,
            branches=stats.active_branches,
            hit_rate=stats.hit_rate,
        )


@dataclass(frozen=True)
class BranchSummary:
    """One active branch and how many distinct blocks it references."""

    branch_id: str
    tenant_id: str
    blocks: int

    @classmethod
    def of(cls, info: BranchInfo) -> BranchSummary:
        return cls(branch_id=info.branch_id, tenant_id=info.tenant_id, blocks=info.num_blocks)
