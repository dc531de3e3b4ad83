"""Iteration-time models of prefill and decode, fitted online from records.

Prefill: ``t_ms ≈ a + b·uncached + c·cached + d·uncached·(uncached+cached)/1e4``
(the last term is attention of the new tokens over the whole context).
Decode: ``t_ms ≈ a + b·batch + c·context_tokens``.
Token counts are per iteration (batch totals), as workers report them.

Which record trains which model (records may be mixed):

- prefill ⇔ ``uncached_prompt_tokens > 0`` and (the node is in the prefill
  phase or ``context_tokens == 0``): a pure prefill iteration. Prefill nodes
  emit one token per finished prompt; that work is negligible.
- decode ⇔ ``uncached_prompt_tokens == 0`` and ``batch_size > 0``.
- anything else (a decode batch with a local prefill mixed in) trains
  neither model: it would bias both. It is counted in ``Profile.skipped``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from core import Phase
from planner.regression import RecursiveLeastSquares, RLSConfig
from planner.scatter import ScatterBand
from planner.share import ShareEffect, clip_share, probe_speed
from planner.types import IterationRecord

Kind = Literal["prefill", "decode"]
# Floor for the relative-error weights: steps shorter than this are timer noise.
MIN_STEP_MS = 0.5
# A weak prior: rows are scaled by 1/t (see `IterationModel.update`), which
# would otherwise let the default prior shrink the coefficients.
DEFAULT_RLS = RLSConfig(prior_var=1e10)
PREFILL_SCALES = (1.0, 1000.0, 1000.0, 100.0)
DECODE_SCALES = (1.0, 10.0, 10_000.0)
ATTENTION_DIVISOR = 1e4
# A step off its prediction by more than this many scatter bands (relative
# error, `ScatterBand.sigma`) is rejected: a preempted or swapped-out step,
# not the machine. Against the band, not the fit's sigma, so a real level
# shift widens the band within ~50 steps and is then learned, not frozen out.
REJECT_BANDS = 6.0
REJECT_AFTER = 50  # errors the band has seen before it may reject
# The host-speed probe is smaller than a step and partly cache-resident, so a
# step may slow more than it does on a memory-bound spell: elasticity up to 2.
SPEED_MAX_GAMMA = 2.0


def classify(record: IterationRecord) -> Kind | None:
    """The model a record trains (module doc), or None for mixed/empty ones."""
    if record.uncached_prompt_tokens > 0:
        if record.phase == Phase.PREFILL or record.context_tokens == 0:
            return "prefill"
        return None
    if record.batch_size > 0:
        return "decode"
    return None


def prefill_features(
    uncached: np.ndarray | float, cached: np.ndarray | float, pairs: np.ndarray | float | None = None
) -> np.ndarray:
    """Feature rows [1, u, c, pairs/1e4] for token totals (arrays broadcast);
    ``pairs``: Σ over the batch's prompts of u_i·(u_i+c_i), default u·(u+c)
    (one prompt)."""
    u = np.asarray(uncached, dtype=float)
    c = np.asarray(cached, dtype=float)
    u, c = np.broadcast_arrays(u, c)
    p = u * (u + c) if pairs is None else np.broadcast_to(np.asarray(pairs, dtype=float), u.shape)
    return np.stack([np.ones_like(u), u, c, p / ATTENTION_DIVISOR], axis=-1)


def decode_features(batch: np.ndarray | float, context: np.ndarray | float) -> np.ndarray:
    """Feature rows [1, batch, context_tokens] (arrays broadcast)."""
    b = np.asarray(batch, dtype=float)
    ctx = np.asarray(context, dtype=float)
    b, ctx = np.broadcast_arrays(b, ctx)
    return np.stack([np.ones_like(b), b, ctx], axis=-1)


class IterationModel:
    """One phase's iteration-time regression (milliseconds).

    What shares the cores: a step that gets less of the CPU than usual is
    slower (`IterationRecord.cpu_share`; `planner.share` learns by how
    much). The regression learns wall time at the typical share: each
    step's time is rescaled by ``share.factor`` before it trains, and a step
    at a known share is predicted times that factor. ``theta``,
    ``param_cov`` and `Profile` predictions (what the planner and simulator
    read) are at the typical share, the host as it usually is; a record
    without a share is taken to be at it.

    How fast the host is: on a slow spell that leaves the share alone (a
    neighbour filling the caches and the memory bus) a fixed reference
    computation takes longer (`IterationRecord.host_probe_us`); ``speed``
    learns the elasticity of step time on it the same way. The regression
    is at the speed's fixed anchor (`planner.share`: a spell moves the
    typical speed) and every prediction without a record's own probe,
    ``theta`` and ``param_cov`` included, is carried to the typical speed
    by ``speed.drift``. The two effects multiply; each learns from the log
    error left after the other's factor.

    ``scatter`` watches the a-priori errors (`planner.scatter`): the noise
    band and the parameter covariance are widened to what it sees, and a
    step beyond ``REJECT_BANDS`` bands is left out of the fit (outlier
    rejection on top of the regression's Huber weights).
    """

    def __init__(self, kind: Kind, config: RLSConfig = DEFAULT_RLS) -> None:
        self.kind: Kind = kind
        self.rls = RecursiveLeastSquares(PREFILL_SCALES if kind == "prefill" else DECODE_SCALES, config)
        self.memory = 1.0 / max(1.0 - config.forgetting, 1e-6)
        self.scatter = ScatterBand(memory=min(self.memory, 1e6))
        self.share = ShareEffect(memory=min(self.memory, 1e6))
        self.speed = ShareEffect(memory=min(self.memory, 1e6), max_gamma=SPEED_MAX_GAMMA, anchored=True)
        self.rejected = 0  # steps rejected as outliers (REJECT_BANDS)

    def features(self, record: IterationRecord) -> np.ndarray:
        if self.kind == "prefill":
            return prefill_features(record.uncached_prompt_tokens, record.cached_prompt_tokens, record.attention_pairs)
        return decode_features(record.batch_size, record.context_tokens)

    def update(self, record: IterationRecord) -> None:
        """Train on one record of this model's kind (caller classified it).

        Step-time noise is multiplicative (a preempted 2 ms step and a
        preempted 200 ms step are off by similar factors), so each row is
        scaled by 1/t: least squares then minimises relative error, and a few
        long steps no longer drown the short ones. Coefficients keep their
        meaning (ms per feature); `sigma` becomes a relative error.
        """
        s, v = clip_share(record.cpu_share), probe_speed(record.host_probe_us)
        if s is not None:
            self.share.observe(s)
        if v is not None:
            self.speed.observe(v)
        f_share, f_speed = self.share.factor(s), self.speed.factor(v)
        y = record.elapsed_ms / (f_share * f_speed)  # wall ms at the typical share and the speed's anchor
        w = 1.0 / max(y, MIN_STEP_MS)
        x = self.features(record)
        if self.rls.ready:
            mean = float(x @ self.rls.theta)
            if mean > 0:
                log_error = math.log(max(record.elapsed_ms, 1e-9) / mean)
                if s is not None:
                    self.share.learn(s, log_error - math.log(f_speed))
                if v is not None:
                    self.speed.learn(v, log_error - math.log(f_share))
                error = y / mean - 1.0
                outlier = self.scatter.count >= REJECT_AFTER and abs(error) > REJECT_BANDS * self.scatter.sigma
                self.scatter.update(error)
                if outlier:
                    self.rejected += 1
                    return
        self.rls.update(x * w, y * w)

    def predict(self, record: IterationRecord) -> float:
        """Mean ms of ``record``'s step, at its own CPU share and host speed
        when known."""
        return self.predict_band(record)[0]

    def predict_band(self, record: IterationRecord) -> tuple[float, float]:
        """(mean, sd) ms of one step like ``record`` (noise included), at its
        own CPU share and host speed when known."""
        mean, sd = _predict(self, self.features(record), include_noise=True)  # at the typical speed
        v = probe_speed(record.host_probe_us)
        f_speed = 1.0 if v is None else self.speed.factor(v) / self.speed.drift
        f = self.share.factor(clip_share(record.cpu_share)) * f_speed
        mean, sd = mean * f, sd * f
        beyond = mean * self.speed.spread(v)  # a host speed the fit has not seen (`ShareEffect.spread`)
        return mean, math.hypot(sd, beyond)

    @property
    def theta(self) -> np.ndarray:
        """Coefficients (raw units) of wall time at the typical share and host speed."""
        return self.rls.theta * self.speed.drift

    def predict_many(self, xs: np.ndarray) -> np.ndarray:
        """Mean wall ms at the typical share and host speed for feature rows ``xs``."""
        return self.rls.predict_many(xs, include_noise=False)[0] * self.speed.drift

    @property
    def noise_sigma(self) -> float:
        """Relative noise of one step: the fit's, or the scatter's if wider."""
        return max(self.rls.sigma, self.scatter.sigma if self.scatter.count else 0.0)

    @property
    def widen(self) -> float:
        """Factor (≥ 1) on the fit's coefficient variance for the scatter it
        sees: (band / fit sigma)² when the band is wider, times the
        correlated-error factor (`ScatterBand.inflation`)."""
        return (self.noise_sigma / max(self.rls.sigma, 1e-12)) ** 2 * self.scatter.inflation

    @property
    def param_cov(self) -> np.ndarray:
        """Covariance of ``theta``: the fit's, times ``widen``."""
        return self.rls.param_cov * self.widen * self.speed.drift**2

    @property
    def samples(self) -> int:
        return self.rls.count


def _predict(model: IterationModel, x: np.ndarray, include_noise: bool) -> tuple[float, float]:
    """(mean, std) in ms; the fitted noise is relative (see `update`), so one
    observation's noise is sigma * mean."""
    mean, sd = model.rls.predict(x, include_noise=False)
    mean, sd = mean * model.speed.drift, sd * model.speed.drift * math.sqrt(model.widen)
    if include_noise:
        sd = float(np.hypot(sd, model.noise_sigma * mean))
    return mean, sd


class Profile:
    """Both iteration models of one node type; the planner's and simulator's
    view of how fast a node computes."""

    def __init__(self, prefill: IterationModel | None = None, decode: IterationModel | None = None) -> None:
        self.prefill = prefill or IterationModel("prefill")
        self.decode = decode or IterationModel("decode")
        self.skipped = 0  # mixed or empty records seen

    @classmethod
    def from_records(cls, records: Iterable[IterationRecord], config: RLSConfig = DEFAULT_RLS) -> Profile:
        """Fit a fresh profile on ``records`` in time order."""
        profile = cls(IterationModel("prefill", config), IterationModel("decode", config))
        profile.update(sorted(records, key=lambda r: r.t))
        return profile

    @classmethod
    def from_coefficients(
        cls,
        prefill: tuple[float, float, float, float],
        decode: tuple[float, float, float],
        prefill_sigma_ms: float = 0.0,
        decode_sigma_ms: float = 0.0,
    ) -> Profile:
        """A profile with known coefficients (ms; per token; per token²/1e4) and
        no parameter uncertainty; it does not learn from later updates."""
        p = IterationModel("prefill")
        p.rls = RecursiveLeastSquares.from_coefficients(prefill, PREFILL_SCALES, prefill_sigma_ms)
        d = IterationModel("decode")
        d.rls = RecursiveLeastSquares.from_coefficients(decode, DECODE_SCALES, decode_sigma_ms)
        return cls(p, d)

    def update(self, records: Iterable[IterationRecord]) -> None:
        """Train on records (call in time order); mixed ones are skipped."""
        for record in records:
            if record.elapsed_ms <= 0 or not math.isfinite(record.elapsed_ms):
                self.skipped += 1
                continue
            kind = classify(record)
            if kind == "prefill":
                self.prefill.update(record)
            elif kind == "decode":
                self.decode.update(record)
            else:
                self.skipped += 1

    @property
    def ready(self) -> bool:
        """Both models past their robust warm-up."""
        return self.prefill.rls.ready and self.decode.rls.ready

    def predict_prefill_ms(self, uncached: int, cached: int, include_noise: bool = True) -> tuple[float, float]:
        """(mean, std) of one prefill iteration computing ``uncached`` new tokens
        over ``cached`` prefix tokens (batch totals), in ms."""
        return _predict(self.prefill, prefill_features(uncached, cached), include_noise)

    def predict_decode_ms(self, batch: int, context: int, include_noise: bool = True) -> tuple[float, float]:
        """(mean, std) of one decode iteration of ``batch`` requests attending
        ``context`` KV tokens in total, in ms."""
        return _predict(self.decode, decode_features(batch, context), include_noise)

    # -- persistence ---------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"version": 1}
        for m in (self.prefill, self.decode):
            out[m.kind] = m.rls.to_dict()
            host = {"share": dataclasses.asdict(m.share), "speed": dataclasses.asdict(m.speed)}
            out[f"{m.kind}_host"] = {**host, **m.scatter.to_dict()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """Inverse of ``to_dict``; a profile saved before the host part
        (``*_host``) loads with a fresh band and share 1, one saved before
        the host speed with a fresh speed effect."""
        if data.get("version") != 1:
            raise ValueError(f"unsupported profile version {data.get('version')!r}")
        models = []
        for kind in ("prefill", "decode"):
            m = IterationModel(kind)
            m.rls = RecursiveLeastSquares.from_dict(data[kind])
            m.memory = 1.0 / max(1.0 - m.rls.config.forgetting, 1e-6)
            host = data.get(f"{kind}_host")
            if isinstance(host, dict):
                m.share = ShareEffect(**host["share"])
                if isinstance(host.get("speed"), dict):
                    m.speed = ShareEffect(**host["speed"])
                m.scatter = ScatterBand.from_dict(host)
            models.append(m)
        return cls(*models)

    def to_json(self, path: str | Path) -> None:
        """Write the profile to ``path`` as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_json(cls, path: str | Path) -> Profile:
        """Load a profile written by ``to_json``."""
        return cls.from_dict(json.loads(Path(path).read_text()))
