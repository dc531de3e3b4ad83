"""Offered mix of a closed loop: weights that undo what the current split favours.

An agent alternates between waiting for a request (response time R) and
working between requests (tool time, think time: the gap Z). With N_k agents
of a kind, the gateway sees that kind's requests at rate N_k / (Z + R). The
served mix is therefore bent toward whatever the current split serves fast:
at few prefill nodes, prompt-heavy agents queue for prefill, send fewer
requests, and look rarer than they are — so a planner fitted on the served
mix keeps the split that starves them.

Weighting each finished request by ``(Z + R) / (Z + R0)``, with R0 its
response time on an unloaded node (from the fitted iteration models), turns
the served rate ``N_k / (Z + R)`` into ``N_k / (Z + R0)``: the rate the
agents would offer if nothing queued. Token means computed with these
weights describe the offered mix. Requests without a known gap (first turns,
open-loop traffic, whose rate does not depend on R) keep weight 1.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import chain

import numpy as np

from planner.profile import Profile, decode_features, prefill_features
from planner.types import RequestSample


def unloaded_response_s(profile: Profile, uncached: np.ndarray, cached: np.ndarray, output: np.ndarray) -> np.ndarray:
    """R0 per request: its prefill alone in one iteration, then its output
    tokens decoded in a batch of one (context at mid-decode), seconds."""
    pre = profile.prefill.predict_many(prefill_features(uncached, cached))
    ctx = uncached + cached + output / 2.0
    step = profile.decode.predict_many(decode_features(np.ones_like(ctx), ctx))
    return (np.maximum(pre, 0.0) + np.maximum(output - 1.0, 0.0) * np.maximum(step, 0.0)) / 1000.0


def offered_weights(profile: Profile, samples: Sequence[RequestSample], max_weight: float) -> np.ndarray:
    """One weight per sample in [1, max_weight] (module doc)."""
    w = np.ones(len(samples))
    known = [i for i, s in enumerate(samples) if s.gap_s is not None and s.e2e_s is not None]
    if not known or not profile.ready:
        return w
    fields = (
        (
            samples[i].uncached_prompt_tokens,
            samples[i].cached_prompt_tokens,
            samples[i].output_tokens,
            samples[i].gap_s,
            samples[i].e2e_s,
        )
        for i in known
    )
    # fromiter over a flat stream: np.array on a list of tuples converts element by element (a planner tick
    # of a 3,072-GPU simulation folds ~10k samples)
    rows = np.fromiter(chain.from_iterable(fields), dtype=float, count=5 * len(known)).reshape(-1, 5)
    u, c, o, gap, e2e = rows.T
    gap = np.maximum(gap, 0.0)
    r0 = unloaded_response_s(profile, u, c, o)
    ratio = (gap + np.maximum(e2e, 0.0)) / np.maximum(gap + r0, 1e-3)
    w[known] = np.clip(ratio, 1.0, max_weight)
    return w


class TurnGaps:
    """The gateway's view of Z: per branch, when its previous request
    finished, so the next one's gap is its arrival minus that. Bounded (the
    least recently used branches are forgotten first); a branch that ends is
    dropped at once."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._last_finish: OrderedDict[str, float] = OrderedDict()

    def finished(self, branch: str, arrival: float, finish: float, last_in_branch: bool) -> float | None:
        """Record one finished request of ``branch``; returns its gap (None
        for the branch's first request, or one whose predecessor is forgotten)."""
        last = self._last_finish.pop(branch, None)
        gap = None if last is None else max(0.0, arrival - last)
        if not last_in_branch:
            self._last_finish[branch] = finish
            if len(self._last_finish) > self.capacity:
                self._last_finish.popitem(last=False)
        return gap

    def __len__(self) -> int:
        return len(self._last_finish)
