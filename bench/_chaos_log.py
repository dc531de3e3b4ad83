"""What the chaos faults did: the record `bench chaos` reports.

Each fault of `bench chaos` (`_chaos_switch`, `_chaos_kill`, `_chaos_db`)
writes its counts and events here; the bench copies them into its JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ChaosLog:
    switches: int = 0
    switches_failed: int = 0
    switches_refused: int = 0
    worker_kills: int = 0
    worker_restarts: int = 0
    killed_node: str | None = None
    restart_s: float = 0.0
    db_outage_s: float = 0.0
    events: list[str] = field(default_factory=list)
