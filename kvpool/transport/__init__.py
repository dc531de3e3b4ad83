"""Block transports between host stores: NIXL (real) and an in-process fake.

Public API: the `BlockTransport` / `TransferHandle` contract, the error
hierarchy, and `TRANSPORTS` (name -> class) for configuration.
"""

from __future__ import annotations

from kvpool.transport.base import (
    BlockTransport,
    PeerUnavailable,
    TransferError,
    TransferHandle,
    TransferState,
    TransferTimeout,
    contiguous_runs,
)
from kvpool.transport.fake import FakeFabric, FakeTransport
from kvpool.transport.nixl import NixlTransport, NixlTransportConfig

# NixlTransport imports NIXL only when constructed.
TRANSPORTS: dict[str, type] = {"nixl": NixlTransport, "fake": FakeTransport}

__all__ = [
    "BlockTransport",
    "FakeFabric",
    "FakeTransport",
    "NixlTransport",
    "NixlTransportConfig",
    "PeerUnavailable",
    "TRANSPORTS",
    "TransferError",
    "TransferHandle",
    "TransferState",
    "TransferTimeout",
    "contiguous_runs",
]
