"""Hold-out check of the iteration-time models on recorded steps.

`fit_mape` fits a fresh `Profile` model online on each kind's earlier
records and scores it on the later ones it never saw: the error the planner
would make predicting steps it has not measured yet, and whether its
uncertainty band covers them as often as it claims.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from planner.profile import DEFAULT_RLS, IterationModel, Kind, classify
from planner.regression import RLSConfig
from planner.types import IterationRecord

BAND_Z = 1.645  # the two-sided 90 % band


@dataclass(frozen=True)
class FitReport:
    """Hold-out accuracy of a profile fitted online on earlier records.

    mape_*: mean absolute percentage error as a fraction (0.1 = 10 %) on the
    held-back later records of that kind; None when there are none.
    floor_*: the same error of a model fitted on every record of the kind,
    held-back ones included: what no model of this form, however trained,
    gets below on these records (timing noise and unmodelled effects).
    band_*: share of the held-back records inside the model's own two-sided
    90 % band (mean ± 1.645 sd, noise included): 0.9 when the uncertainty
    matches the scatter, less when the model is overconfident.
    """

    mape_prefill: float | None
    mape_decode: float | None
    floor_prefill: float | None
    floor_decode: float | None
    train_prefill: int
    test_prefill: int
    train_decode: int
    test_decode: int
    band_prefill: float | None = None
    band_decode: float | None = None


def _mape(model: IterationModel, records: list[IterationRecord]) -> float:
    return float(np.mean([abs(model.predict(r) - r.elapsed_ms) / r.elapsed_ms for r in records]))


def _band(model: IterationModel, records: list[IterationRecord]) -> float:
    inside = []
    for r in records:
        mean, sd = model.predict_band(r)
        inside.append(abs(r.elapsed_ms - mean) <= BAND_Z * sd)
    return float(np.mean(inside))


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
    result: dict[str, float | int | None] = {}
    for kind, rows in by_kind.items():
        n_test = int(round(len(rows) * holdout_fraction))
        train, test = rows[: len(rows) - n_test], rows[len(rows) - n_test :]
        model = IterationModel(kind, config)
        for record in train:
            model.update(record)
        result[f"mape_{kind}"] = _mape(model, test) if test and train else None
        result[f"band_{kind}"] = _band(model, test) if test and train else None
        hindsight = IterationModel(kind, replace(config, forgetting=1.0))
        for record in rows:
            hindsight.update(record)
        result[f"floor_{kind}"] = _mape(hindsight, test) if test and train else None
        result[f"train_{kind}"] = len(train)
        result[f"test_{kind}"] = len(test)
    # result: the report's fields by name, float or int or None; FitReport checks none of them at run time.
    return FitReport(**result)  # type: ignore[arg-type]
