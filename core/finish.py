"""Why a generation ended, at every layer (worker, orchestrator, API).

STOP and LENGTH end a request. ABORT and MIGRATED end only the *segment*
running on one node: the node gave the request up (a phase switch, a
migration) and the gateway continues it elsewhere. ERROR is a failed
segment; the gateway reports it.
"""

from __future__ import annotations

import enum


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    MIGRATED = "migrated"
    ERROR = "error"

    @property
    def ends_request(self) -> bool:
        """The request is complete (as opposed to: continue it elsewhere, or fail)."""
        return self in (FinishReason.STOP, FinishReason.LENGTH)

    @property
    def resumable(self) -> bool:
        """The node gave the request up; its continuation runs on another node."""
        return self in (FinishReason.ABORT, FinishReason.MIGRATED)
