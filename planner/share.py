"""How much a step slows when its engine gets less of the CPU.

A step that needs C CPU-ms and gets a share s of its core would take C / s
wall ms if every waiting moment were the step's own. The measured share
(`IterationRecord.cpu_share`, ran / (ran + waited) over the engine
process's threads) is coarser than that: it covers every thread of the
engine (some wait while the compute thread runs, without slowing it) and
the sampling interval around the step, not the step itself. So the model
learns the elasticity instead of assuming it:

    wall ≈ wall_at_ref · (share_ref / s)^gamma

``share_ref`` is the typical share (exponentially weighted mean), and
``gamma`` the least-squares slope of the log error of the typical-share
prediction on log(share_ref / s), clipped to [0, 1] (0: the measured share
says nothing; 1: the step is pure CPU time on a shared core). The slope
is attenuated by the share's measurement noise, which is what a predictor
fed with noisy shares should use. On one `bench planner` run's records
(2 cores shared with other jobs) it settled at 0.20 (prefill) and 0.24
(decode); taking gamma = 1 instead made the prefill hold-out error 0.205
against 0.079.

The same elasticity serves the host-speed probe (`probe_speed`: the
reciprocal of `IterationRecord.host_probe_us`, reference computations per
CPU ms): a step slows by ``(anchor / speed)^gamma`` when a fixed piece of
work runs slower than usual on the host, gamma learned the same way. That
effect is *anchored*: a slow spell of minutes moves the typical speed, and
a regression normalised to a moving reference would mix steps scaled to
different ones (on a spell of a quarter of a run, a fifth of the run
slower, the post-spell steps came out 8 % fast). So the regression is
normalised to the typical speed of the first `MIN_SAMPLES` probes, fixed
from then on (``anchor``), and ``drift`` = factor at the typical speed
now carries a typical step from the anchor to the host as it now is. As
the log ratio to a fixed anchor is not centred, the slope is taken about
the means (an uncentred one charged the regression's mean error to the
probe: 0.7 on a prefill fit whose batch slope was 0.32). And it is
*verified*: the probe scatters and drifts a little on any host, and a
slope learned from that, applied to later steps, can add error (that fit
scored 0.074 on its held-back steps against 0.059 without the probe). So
each step is first predicted with and without the slope's factor, before
either learns from it, and gamma is used only while the mean absolute
log error with it is the smaller (``gain`` > 0).

What the anchored effect does not know it says: a step at a host speed
beyond the spread the effect was fitted on (``spread``) is predicted with
the elasticity in use, and its band widens by what an elasticity anywhere
between 0 (nothing of the step slows like the probe) and 1 (all of it
does) could make of the excess distance. On one `bench planner` run
(2026-12-06 16:04 UTC) the probe read ~20 % slower through the last three
tenths and the steps ran 17 % slower than predicted; the probe had varied
by its own scatter only while the models learned (no decode slope
verified), so the prediction stayed where it was, and the decode band (sd
5.5 % of a step) covered 0.24 of the held-back steps where it claims 0.9;
with the spread, 0.61 (prefill 0.77 -> 0.85), the errors unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Shares below this are a stalled engine, not a slower one: dividing by them
# would turn one descheduled step into a 20x "faster" sample.
MIN_SHARE = 0.05
MIN_SAMPLES = 50  # shares seen before gamma is used (until then: 0)


def clip_share(share: float | None) -> float | None:
    if share is None or not math.isfinite(share):
        return None
    return min(max(share, MIN_SHARE), 1.0)


def probe_speed(probe_us: float | None) -> float | None:
    """Host speed from a probe's CPU µs: probes per CPU ms (None when unknown)."""
    if probe_us is None or not math.isfinite(probe_us) or probe_us <= 0:
        return None
    return 1000.0 / probe_us


@dataclass
class ShareEffect:
    """Typical share and elasticity (module doc); ``memory``: samples over
    which old ones fade; ``max_gamma``: the elasticity's upper clip;
    ``anchored``: fixed reference, centred slope, and gamma used only while
    it has predicted better than none (module doc)."""

    memory: float = 1000.0
    max_gamma: float = 1.0
    anchored: bool = False
    anchor: float | None = None
    ref: float = 1.0
    seen: int = 0
    sxx: float = 0.0  # exponentially weighted mean of l², l = log(base / s)
    sxy: float = 0.0  # ... of l · log error
    sx: float = 0.0  # ... of l (anchored only)
    sy: float = 0.0  # ... of log error (anchored only)
    gain: float = 0.0  # ... of |error without the effect| − |error with it|, before learning (anchored only)

    def observe(self, share: float) -> None:
        """Count one measured share into the typical one."""
        self.seen += 1
        self.ref += (share - self.ref) / min(float(self.seen), self.memory)
        if self.anchored and self.anchor is None and self.seen >= MIN_SAMPLES:
            self.anchor = self.ref

    @property
    def base(self) -> float:
        """What a factor is relative to: the anchor once set, else the typical share."""
        return self.ref if self.anchor is None else self.anchor

    def learn(self, share: float, log_error: float) -> None:
        """One step's log(wall / prediction at ``base``) at ``share``."""
        if not math.isfinite(log_error):
            return
        lx = math.log(self.base / share)
        rate = 1.0 / min(float(self.seen), self.memory)
        if self.anchored:
            # Scored before it learns from the step: the error at the typical
            # value as the model predicts now, and with the slope's factor.
            typical = log_error - self.gamma * self.sx
            with_effect = typical - self.slope * (lx - self.sx)
            self.gain += rate * (abs(typical) - abs(with_effect) - self.gain)
            self.sx += rate * (lx - self.sx)
            self.sy += rate * (log_error - self.sy)
        self.sxx += rate * (lx * lx - self.sxx)
        self.sxy += rate * (lx * log_error - self.sxy)

    @property
    def slope(self) -> float:
        """The learned elasticity, clipped to [0, max_gamma]: through 0 (l
        is centred by ``ref``), or about the means when anchored."""
        vxx, vxy = self.sxx, self.sxy
        if self.anchored:
            vxx, vxy = vxx - self.sx**2, vxy - self.sx * self.sy
        if self.seen < MIN_SAMPLES or vxx <= 0:
            return 0.0
        return min(max(vxy / vxx, 0.0), self.max_gamma)

    @property
    def gamma(self) -> float:
        """The elasticity in use: ``slope``, or 0 while an anchored effect has
        not predicted the steps better than none."""
        return self.slope if not self.anchored or self.gain > 0 else 0.0

    def factor(self, share: float | None) -> float:
        """Wall time at ``share`` over wall time at ``base`` (1 when unknown)."""
        return 1.0 if share is None else (self.base / share) ** self.gamma

    def spread(self, share: float | None) -> float:
        """Log-sd a prediction at ``share`` gets from not knowing the
        elasticity beyond the values fitted on (anchored only, once the
        anchor is set; else 0): the squared distance of log(base / share)
        from their mean in excess of their variance (what the fit's own
        noise already holds), times the mean square of (g − gamma) for g
        uniform on [0, 1]; its root."""
        if share is None or not self.anchored or self.anchor is None:
            return 0.0
        excess = (math.log(self.base / share) - self.sx) ** 2 - max(self.sxx - self.sx**2, 0.0)
        if excess <= 0:
            return 0.0
        return math.sqrt(excess * (1.0 / 12.0 + (0.5 - self.gamma) ** 2))

    @property
    def drift(self) -> float:
        """Wall time at the typical share over wall time at ``base`` (1 unanchored)."""
        return self.factor(self.ref)
