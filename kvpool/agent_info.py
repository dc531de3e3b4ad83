"""What a node tells its peers about its host store: `kv-agent.json`.

The connector's worker side writes it once the host store is registered
with the transport; the worker's HTTP side serves it on
`GET /internal/kv/agent` (peers fetch it once per node) and reads the
store's layout from it for its stats.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import asdict, dataclass

FILE_NAME = "kv-agent.json"
# Environment variable holding the cluster token: a worker bound beyond
# loopback answers /internal (this endpoint included) only with it, so
# a node fetching a peer's agent info sends it.
CLUSTER_TOKEN_ENV = "EVOLVING_CLUSTER_TOKEN"


@dataclass(frozen=True)
class AgentInfo:
    node_id: str
    agent_name: str  # "" when the node has no transport agent (local-only pool)
    metadata_b64: str  # the transport's local descriptor, base64
    region_base: int  # address of the host store's buffer in the node's process
    block_bytes: int
    capacity_blocks: int

    def write(self, run_dir: pathlib.Path) -> None:
        """Atomically (write + rename): a reader never sees half a file."""
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / (FILE_NAME + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.rename(run_dir / FILE_NAME)

    @classmethod
    def read(cls, run_dir: pathlib.Path) -> AgentInfo | None:
        """The node's info, or None before the connector has written it."""
        path = run_dir / FILE_NAME
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))
