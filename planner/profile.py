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

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from core import Phase
from planner.regression import RecursiveLeastSquares, RLSConfig
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
    """One phase's iteration-time regression (milliseconds)."""

    def __init__(self, kind: Kind, config: RLSConfig = DEFAULT_RLS) -> None:
        self.kind: Kind = kind
        self.rls = RecursiveLeastSquares(PREFILL_SCALES if kind == "prefill" else DECODE_SCALES, config)

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
        w = 1.0 / max(record.elapsed_ms, MIN_STEP_MS)
        self.rls.update(self.features(record) * w, record.elapsed_ms * w)

    def predict(self, record: IterationRecord) -> float:
        return self.rls.predict(self.features(record))[0]

    @property
    def samples(self) -> int:
        return self.rls.count


def _predict(model: IterationModel, x: np.ndarray, include_noise: bool) -> tuple[float, float]:
    """(mean, std) in ms; the fitted noise is relative (see `update`), so one
    observation's noise is sigma * mean."""
    mean, sd = model.rls.predict(x, include_noise=False)
    if include_noise:
        sd = float(np.hypot(sd, model.rls.sigma * mean))
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
        return {"version": 1, "prefill": self.prefill.rls.to_dict(), "decode": self.decode.rls.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        if data.get("version") != 1:
            raise ValueError(f"unsupported profile version {data.get('version')!r}")
        p = IterationModel("prefill")
        p.rls = RecursiveLeastSquares.from_dict(data["prefill"])
        d = IterationModel("decode")
        d.rls = RecursiveLeastSquares.from_dict(data["decode"])
        return cls(p, d)

    def to_json(self, path: str | Path) -> None:
        """Write the profile to ``path`` as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_json(cls, path: str | Path) -> Profile:
        """Load a profile written by ``to_json``."""
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class FitReport:
    """Hold-out accuracy of a profile fitted online on earlier records.

    mape_*: mean absolute percentage error as a fraction (0.1 = 10 %) on the
    held-back later records of that kind; None when there are none.
    floor_*: the same error of a model fitted on every record of the kind,
    held-back ones included: what no model of this form, however trained,
    gets below on these records (timing noise and unmodelled effects).
    """

    mape_prefill: float | None
    mape_decode: float | None
    floor_prefill: float | None
    floor_decode: float | None
    train_prefill: int
    test_prefill: int
    train_decode: int
    test_decode: int


def _mape(model: IterationModel, records: list[IterationRecord]) -> float:
    return float(np.mean([abs(model.predict(r) - r.elapsed_ms) / r.elapsed_ms for r in records]))


def fit_mape(
    records: Iterable[IterationRecord], holdout_fraction: float = 0.3, config: RLSConfig = DEFAULT_RLS
) -> FitReport:
    """Fit on the earliest (1 − holdout_fraction) of each kind's records, in
    time order, and report MAPE on the rest (never trained on)."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError("holdout_fraction must be in (0, 1)")
    by_kind: dict[Kind, list[IterationRecord]] = {"prefill": [], "decode": []}
    for record in sorted(records, key=lambda r: r.t):
        kind = classify(record)
        if kind is not None and record.elapsed_ms > 0:
            by_kind[kind].append(record)
    result: dict[str, Any] = {}  # FitReport's fields
    for kind, rows in by_kind.items():
        n_test = int(round(len(rows) * holdout_fraction))
        train, test = rows[: len(rows) - n_test], rows[len(rows) - n_test :]
        model = IterationModel(kind, config)
        for record in train:
            model.update(record)
        result[f"mape_{kind}"] = _mape(model, test) if test and train else None
        hindsight = IterationModel(kind, replace(config, forgetting=1.0))
        for record in rows:
            hindsight.update(record)
        result[f"floor_{kind}"] = _mape(hindsight, test) if test and train else None
        result[f"train_{kind}"] = len(train)
        result[f"test_{kind}"] = len(test)
    return FitReport(**result)
