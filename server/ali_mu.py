"""ALI-DPFL: estimators of the strong-convexity constant mu for Eq. (9).

Two estimators, chosen by `ali-mu-estimator`:

- `dp-secant` (default): post-processing only. It uses nothing but the global
  models the server already holds, i.e. the aggregate of the clients' DP-SGD
  releases, so no ledger entry is needed and the ledgers stay exact. Round k
  ran tau_k DP-SGD steps from w_k and produced w_{k+1}; its aggregated
  pseudo-gradient is G_k = (w_k - w_{k+1}) / (eta tau_k) (plain SGD: the
  p_i-weighted mean of the noisy clipped gradients along the round's
  trajectories; momentum would carry each step's noise into later steps and
  break the V_k below, so the config refuses momentum != 0 with this
  estimator). The secant between consecutive rounds,
      mu_k = || G_k - G_{k-1} || / || m_k - m_{k-1} ||,  m_k = (w_k + w_{k+1}) / 2
  (the midpoints of the two trajectories), estimates the curvature. The
  DP noise inflates ||G_k - G_{k-1}||^2 by a known amount (public parameters
  only): the noise in G_k is sum_i p_i / tau_k * sum_t z_t / (q |D_i|) with
  z_t ~ N(0, sigma^2 C^2 I_d), so E||noise||^2 = V_k = sum_i p_i^2 sigma^2 C^2 d
  / (tau_k (q |D_i|)^2). It is subtracted; when nothing is left (the secant is
  all noise) the round gives no estimate and the previous mu is kept.
  Not subtracted: round k-1's noise also moved the model round k starts from,
  so G_k's true part carries the curvature times that displacement, correlated
  with G_{k-1}'s noise. On an isotropic quadratic (Hessian mu I) that cross
  term is mu eta (V_k + V_{k-1}), and once noise dominates this estimate tends
  to 2 sqrt(mu / eta) at tau = 1, whatever mu (4x mu at mu = 0.5, eta = 0.1;
  review of session 19). Solving for it assumes that the curvature along the
  trajectory is the curvature in the noise's directions: on the suites' CNNs
  that version read mu 0.01-0.06 where the paper's own estimator read 0.15-1.6
  on the same trajectory (this form: 0.07-0.20;
  presets/repro/ali-table2/compare_mu.py), so it is not used.
  Also works under secure aggregation (only the aggregate is used).

- `paper`: the paper's estimator, mu = sum_i p_i ||grad F_i(w^i) - grad F_i(w)||
  / ||w^i - w||, with the TRUE full-batch local gradients at the round's start
  model w and at the client's result w^i. Clients compute the gradient
  difference norm without noise (client/updates/ali_paper.py): that is a
  data-dependent release outside the DP accounting, so it leaks; a warning is
  logged on both sides, and the DP-SGD ledger entries carry that as an
  `assumption` (common/privacy/plan.py), so the reported epsilon is marked
  NOT A GUARANTEE.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from common.privacy.ali import GRAD_DIFF_METRIC, PAPER_WARNING  # noqa: F401  (re-exported)

ESTIMATORS = ("dp-secant", "paper")


def noise_variance(weights: Mapping[int, float], sizes: Mapping[int, int], tau: int, sample_rate: float,
                   clip: float, noise_multiplier: float, num_params: int) -> float:
    """E||noise of G_k||^2 = sum_i p_i^2 sigma^2 C^2 d / (tau (q |D_i|)^2) (public quantities only)."""
    if tau <= 0:
        return 0.0
    return math.fsum(
        (w * w) * (noise_multiplier * clip) ** 2 * num_params / (tau * (sample_rate * sizes[p]) ** 2)
        for p, w in weights.items()
    )


class SecantMu:
    """The `dp-secant` estimator: feed it every round's (w_k, w_{k+1}, tau_k, weights)."""

    def __init__(self, lr: float, sample_rate: float, clip: float, noise_multiplier: float,
                 sizes: Mapping[int, int]):
        self.lr, self.q, self.clip, self.sigma = float(lr), float(sample_rate), float(clip), float(noise_multiplier)
        self.sizes = dict(sizes)
        self._prev: tuple[np.ndarray, np.ndarray, float] | None = None  # (G, midpoint, V)
        self.last_signal: float | None = None  # debiased ||G_k - G_{k-1}||^2 (diagnostics)

    def update(self, w_start: np.ndarray, w_end: np.ndarray, tau: int, weights: Mapping[int, float]) -> float | None:
        """mu estimate after this round, or None (first round, or the secant is all noise)."""
        if tau <= 0:
            return None
        g = (w_start - w_end) / (self.lr * tau)
        mid = 0.5 * (w_start + w_end)
        v = noise_variance(weights, self.sizes, tau, self.q, self.clip, self.sigma, g.size)
        prev, self._prev = self._prev, (g, mid, v)
        if prev is None:
            return None
        g0, mid0, v0 = prev
        signal = float(np.sum((g - g0) ** 2)) - v - v0
        self.last_signal = signal
        dist = float(np.linalg.norm(mid - mid0))
        if signal <= 0 or dist == 0:
            return None
        return math.sqrt(signal) / dist


def paper_mu(w_start: np.ndarray, client_models: Sequence[np.ndarray], grad_diffs: Sequence[float],
             weights: Sequence[float]) -> float | None:
    """The paper's mu = sum_i p_i ||grad F_i(w^i) - grad F_i(w)|| / ||w^i - w|| (p_i renormalised)."""
    total, wsum = 0.0, 0.0
    for w_i, diff, p in zip(client_models, grad_diffs, weights):
        dist = float(np.linalg.norm(w_i - w_start))
        if dist > 0 and 0 <= diff < math.inf:  # a norm: a negative or NaN report is not one
            total += p * diff / dist
            wsum += p
    return total / wsum if wsum > 0 else None
