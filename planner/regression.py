"""Robust recursive least squares with exponential forgetting.

Model: ``y = x · theta + e`` with ``e ~ N(0, sigma²)``. The estimator keeps
``theta``, a normalised covariance ``P`` (parameter covariance is
``sigma² · P``) and a forgetting-weighted noise variance. Old samples lose
weight by ``forgetting`` per update, so the model tracks slow drift.

Robustness: the first ``warmup`` samples are buffered and fitted in one batch
with Huber-weighted iteratively reweighted least squares (scale from the
median absolute deviation); afterwards each update is Huber-weighted against
the predictive standard deviation (residuals beyond ``huber_k`` sigma get
weight ``huber_k / |r|``), and the noise estimate uses the residual clipped
at ``huber_k`` sigma. An outlier therefore moves neither theta nor sigma by
more than a bounded amount.

Features are divided by fixed ``scales`` internally so that token counts in
the thousands and an intercept of 1 live on comparable scales; every public
number (``theta``, ``param_cov``, predictions) is in raw units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution × this = sigma


@dataclass(frozen=True)
class RLSConfig:
    """Settings of one regression.

    forgetting: weight kept by the past per update, in (0.9, 1]; 1 = never
        forget; 0.999 ≈ a memory of 1,000 samples.
    prior_var: prior variance of each scaled coefficient (> 0); large = weak.
    huber_k: residuals beyond this many predictive sigmas are down-weighted
        (> 0); 2.5 keeps ~99 % of normal samples at full weight.
    warmup: samples fitted in one robust batch before online updates (>= 2).
    max_trace: cap on trace(P) in scaled units, against covariance windup when
        the inputs stop varying under forgetting (> 0).
    min_sigma: floor on the noise standard deviation, in units of y (>= 0).
    min_rel_sigma: floor on the predictive sd used to judge outliers, as a
        fraction of |prediction| (>= 0): timings always jitter by about 1 %,
        so a near-perfect fit must not freeze against every later change.
    """

    forgetting: float = 0.999
    prior_var: float = 1e6
    huber_k: float = 2.5
    warmup: int = 20
    max_trace: float = 1e7
    min_sigma: float = 1e-6
    min_rel_sigma: float = 0.01

    def __post_init__(self) -> None:
        if not 0.9 < self.forgetting <= 1.0:
            raise ValueError("forgetting must be in (0.9, 1]")
        if self.prior_var <= 0 or self.huber_k <= 0 or self.max_trace <= 0:
            raise ValueError("prior_var, huber_k and max_trace must be > 0")
        if self.warmup < 2:
            raise ValueError("warmup must be >= 2")
        if self.min_sigma < 0 or self.min_rel_sigma < 0:
            raise ValueError("min_sigma and min_rel_sigma must be >= 0")


class RecursiveLeastSquares:
    """Online robust linear regression over ``dim`` features (see module doc)."""

    def __init__(self, scales: tuple[float, ...], config: RLSConfig = RLSConfig()) -> None:
        if not scales or any(s <= 0 for s in scales):
            raise ValueError("scales must be non-empty and > 0")
        self.config = config
        self.scales = np.asarray(scales, dtype=float)
        dim = len(scales)
        self._theta = np.zeros(dim)  # scaled units
        self._p = np.eye(dim) * config.prior_var
        self._sigma2 = 0.0
        self._weight = 0.0  # forgetting-weighted effective sample count
        self._count = 0  # samples seen, never forgotten
        self._buffer: list[tuple[np.ndarray, float]] = []

    # -- state -------------------------------------------------------------
    @property
    def dim(self) -> int:
        return int(self.scales.size)

    @property
    def count(self) -> int:
        """Samples seen since construction (outliers included)."""
        return self._count

    @property
    def ready(self) -> bool:
        """True once the robust warm-up batch has been fitted."""
        return self._count >= self.config.warmup

    @property
    def theta(self) -> np.ndarray:
        """Coefficients in raw units (copy)."""
        return self._theta / self.scales

    @property
    def sigma(self) -> float:
        """Noise standard deviation estimate, units of y."""
        return max(float(np.sqrt(self._sigma2)), self.config.min_sigma)

    @property
    def param_cov(self) -> np.ndarray:
        """Covariance of the raw-unit coefficients, ``sigma² · S⁻¹ P S⁻¹``."""
        inv = 1.0 / self.scales
        return self.sigma**2 * self._p * np.outer(inv, inv)

    # -- updates -----------------------------------------------------------
    def update(self, x: np.ndarray | list[float], y: float) -> float:
        """Add one sample; returns its a-priori residual (y − prediction)."""
        raw = np.asarray(x, dtype=float)
        # the shape first: dividing a wrong-length x by the scales raises numpy's broadcast error instead
        xs = raw / self.scales if raw.shape == (self.dim,) else raw
        if xs.shape != (self.dim,) or not np.isfinite(xs).all() or not np.isfinite(y):
            raise ValueError("x must be finite with one value per feature, y finite")
        resid = float(y - xs @ self._theta)
        self._count += 1
        if self._count < self.config.warmup:
            self._buffer.append((xs, float(y)))
            self._rls_step(xs, resid, 1.0, resid)
        elif self._count == self.config.warmup:
            self._buffer.append((xs, float(y)))
            self._batch_init()
        else:
            self._robust_step(xs, resid, float(y) - resid)
        return resid

    def update_many(self, xs: np.ndarray, ys: np.ndarray) -> None:
        """Add rows of ``xs`` (n × dim) with targets ``ys`` in order."""
        for x, y in zip(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), strict=True):
            self.update(x, float(y))

    def _robust_step(self, xs: np.ndarray, resid: float, prediction: float) -> None:
        gain = float(xs @ self._p @ xs)
        pred_sd = np.sqrt(max(self._sigma2, self.config.min_sigma**2) * (1.0 + gain))
        pred_sd = max(pred_sd, self.config.min_rel_sigma * abs(prediction))
        r = abs(resid) / pred_sd
        k = self.config.huber_k
        weight = 1.0 if r <= k else k / r
        clipped = float(np.clip(resid, -k * pred_sd, k * pred_sd))
        self._rls_step(xs, resid, weight, clipped)

    def _rls_step(self, xs: np.ndarray, resid: float, weight: float, noise_resid: float) -> None:
        lam = self.config.forgetting
        px = self._p @ xs
        gain = float(xs @ px)
        k_vec = px / (lam / weight + gain)
        self._theta = self._theta + k_vec * resid
        self._p = (self._p - np.outer(k_vec, px)) / lam
        self._p = 0.5 * (self._p + self._p.T)
        trace = float(np.trace(self._p))
        if trace > self.config.max_trace:
            self._p *= self.config.max_trace / trace
        # Normalised a-priori residual: its variance is sigma² whatever P is.
        e2 = noise_resid**2 / (1.0 + gain)
        self._weight = lam * self._weight + 1.0
        self._sigma2 += (e2 - self._sigma2) / self._weight

    def _batch_init(self) -> None:
        """Huber IRLS over the warm-up buffer; replaces the plain RLS state."""
        x = np.stack([b[0] for b in self._buffer])
        y = np.array([b[1] for b in self._buffer])
        self._buffer = []
        prior = np.eye(self.dim) / self.config.prior_var
        w = np.ones(len(y))
        theta = self._theta
        scale = 1.0
        for _ in range(10):
            xtw = x.T * w
            theta = np.linalg.solve(xtw @ x + prior, xtw @ y)
            resid = y - x @ theta
            scale = max(_MAD_TO_SIGMA * float(np.median(np.abs(resid))), self.config.min_sigma, 1e-12)
            r = np.abs(resid) / scale
            w = np.where(r <= self.config.huber_k, 1.0, self.config.huber_k / np.maximum(r, 1e-12))
        clipped = np.clip(y - x @ theta, -self.config.huber_k * scale, self.config.huber_k * scale)
        dof = max(len(y) - self.dim, 1)
        self._theta = theta
        self._p = np.linalg.inv((x.T * w) @ x + prior)
        self._sigma2 = float(np.sum(clipped**2) / dof)
        self._weight = float(len(y))

    # -- prediction --------------------------------------------------------
    def predict(self, x: np.ndarray | list[float], include_noise: bool = True) -> tuple[float, float]:
        """Mean and standard deviation of y at ``x`` (raw units).

        The std always includes parameter uncertainty (``sigma²·xPx``);
        ``include_noise`` adds the per-sample noise ``sigma²`` (predictive
        interval of one observation rather than of the mean).
        """
        mean, sd = self.predict_many(np.asarray(x, dtype=float)[None, :], include_noise)
        return float(mean[0]), float(sd[0])

    def predict_many(self, xs: np.ndarray, include_noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised ``predict`` over rows of ``xs`` (n × dim)."""
        scaled = np.asarray(xs, dtype=float) / self.scales
        mean = scaled @ self._theta
        quad = np.einsum("ij,jk,ik->i", scaled, self._p, scaled)
        var = self.sigma**2 * (quad + (1.0 if include_noise else 0.0))
        return mean, np.sqrt(np.maximum(var, 0.0))

    # -- (de)serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        """Plain-data snapshot (JSON-safe); warm-up buffer included."""
        return {
            "scales": self.scales.tolist(),
            "config": self.config.__dict__.copy(),
            "theta_scaled": self._theta.tolist(),
            "p": self._p.tolist(),
            "sigma2": self._sigma2,
            "weight": self._weight,
            "count": self._count,
            "buffer": [[b[0].tolist(), b[1]] for b in self._buffer],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecursiveLeastSquares:
        """Inverse of ``to_dict``."""
        model = cls(tuple(data["scales"]), RLSConfig(**data["config"]))
        model._theta = np.asarray(data["theta_scaled"], dtype=float)
        model._p = np.asarray(data["p"], dtype=float)
        model._sigma2 = float(data["sigma2"])
        model._weight = float(data["weight"])
        model._count = int(data["count"])
        buffer = cast("list[tuple[list[float], float]]", data["buffer"])
        model._buffer = [(np.asarray(x, dtype=float), float(y)) for x, y in buffer]
        return model

    @classmethod
    def from_coefficients(
        cls, theta: tuple[float, ...], scales: tuple[float, ...], sigma: float = 0.0, config: RLSConfig = RLSConfig()
    ) -> RecursiveLeastSquares:
        """A model that already "knows" ``theta`` (raw units) with zero parameter
        uncertainty and noise ``sigma``; for tests, benchmarks and priors."""
        model = cls(scales, config)
        model._theta = np.asarray(theta, dtype=float) * model.scales
        model._p = np.zeros((model.dim, model.dim))
        model._sigma2 = float(sigma) ** 2
        model._count = config.warmup
        model._weight = float(config.warmup)
        return model
