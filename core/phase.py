"""Prefill and decode: the phase a node serves and the role of one call.

`Phase` is what a worker node is (or is becoming); `Role` is what one
generate call asks of a worker. They have the same two values but answer
different questions: a node in phase DECODE may run a call with role
DECODE that also computes its whole prompt (the local-prefill rule), and a
draining node already serves its target phase while it finishes calls of
the role it is leaving.
"""

from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    """The phase a worker node serves."""

    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def other(self) -> Phase:
        return Phase.DECODE if self is Phase.PREFILL else Phase.PREFILL


class Role(str, enum.Enum):
    """What one generate call asks of the worker.

    PREFILL: compute the prompt, return exactly one token, save the prompt's
    full blocks to the host store and report them in the final chunk.
    DECODE: load the prefix named in the call's KV spec (if any) and
    generate to the end.
    """

    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def phase(self) -> Phase:
        """The node phase that serves this role."""
        return Phase(self.value)
