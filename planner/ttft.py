"""Time to first token as measured, for the SLO repair (``planner.evolving``).

The TTFT floor of the SLO bounds is the model's: the P95 TTFT it predicts
for each split from the mix and its queueing formula. A repair moves off
the current split when that prediction breaks the bound. But the current
split's TTFT is measured as well: the finished requests say how long each
waited for its first token. Where the measured P95 over the persistence
span keeps the bound with the SLO's margin, the split meets it, whatever
the model says, and a repair has nothing to repair (it was allowed only
at no throughput cost, so its whole purpose was the bound). On OpenCode
near at its best split, 1P, the model (its prefill work scaled up 15 %
by the saturation rule for a queue of two at the one prefill node) put
1P's P95 TTFT past the 2 s bound and repaired to 2P at 250 s, while the
static 1P run met it with a P95 of 0.40 s over the whole run.

Requests that report no TTFT (the live gateway's samples do not carry
it yet) leave the check out: the model decides alone, as before.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class TtftHistory:
    """Measured TTFTs keyed by the tick that reported them."""

    def __init__(self, retention_s: float) -> None:
        self.retention_s = retention_s
        self._rows: deque[tuple[float, float]] = deque()  # (reported at, ttft s)

    def add(self, t: float, ttfts: list[float]) -> None:
        self._rows.extend((t, x) for x in ttfts)
        while self._rows and self._rows[0][0] < t - self.retention_s:
            self._rows.popleft()

    def p95(self, now: float, span_s: float, since: float | None, min_requests: int) -> float | None:
        """P95 of the TTFTs reported in the last ``span_s`` (None: the span
        reaches back past ``since``, a switch, or holds fewer than
        ``min_requests``)."""
        start = now - span_s
        if since is not None and since > start:
            return None
        xs = [x for t, x in self._rows if start < t <= now]
        if len(xs) < min_requests:
            return None
        return float(np.percentile(xs, 95))
