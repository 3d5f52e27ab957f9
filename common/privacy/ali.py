"""ALI-DPFL (Ling et al., arXiv 2308.10457): the pure planning math.

Numbers in, numbers out; no Flower, no torch. The server strategy
(`server/strategies/ali_dpfl.py`) calls these every round.

- `iteration_budget` = R_c: the largest number of DP-SGD steps per client whose
  epsilon(delta) is <= the target, by the *same* accountant the client ledgers
  enforce (so a planned round is never refused). Exact integer search
  (`accounting.max_steps(search="exact")`), never the authors' tolerance search,
  which may overshoot the target by up to 0.01 (digest section 3).
- `optimal_tau` = Eq. (9), verbatim:
      tau* = sqrt(1 + [4/mu^2 + 3C^2 + 2 Gamma T mu + sigma^2 C^2 d / B^2]
                      / [(2 + 1/T) (C^2 + sigma^2 C^2 d / B^2)])
  (the paper's constants: eta = 1/(mu T) substituted, so 2 Gamma T mu and
  2 + 1/T; the authors' code mixes in 2 + 2/T: not used here).
- `horizon` = T = min(R_s * tau*_prev, R_c) (R_s the total number of rounds).
- `batch_estimate` = B-hat = max(1, min_i q |D_i|) as a float (the code's
  int(q min |D_i|) can be 0 under Dir(0.05)).
- `round_tau`: half-up rounding (the code's int(x + 0.5)), clamped to [1, tau_max].
- `plan_round`: the tau a round actually runs: 1 when R_s >= R_c (Lemma 1),
  else tau*; optionally raised so the remaining rounds can still spend the
  remaining budget (`spend_budget`); always capped at R_c - t (the last round
  uses the budget exactly, never more).
"""

from __future__ import annotations

import math
from typing import Iterable

from common.privacy import accounting

ACCOUNTANTS = ("rdp", "pld", "ali-eq12")
GRAD_DIFF_METRIC = "ali-grad-diff"  # ||grad F_i(w^i) - grad F_i(w)||: the paper's mu estimator (non-private)
PAPER_WARNING = ("ALI-DPFL ali-mu-estimator = 'paper': clients release the norm of the difference of their TRUE "
                 "(non-private) full-batch gradients every round; this leaks outside the DP accounting, and the "
                 "epsilon reported does not cover it")


def iteration_budget(target_epsilon: float, delta: float, sample_rate: float, noise_multiplier: float,
                     accountant: str = "ali-eq12") -> int:
    """R_c under `accountant` ('ali-eq12': RDP, integer orders 2..63,128,256,512,
    classic conversion, the paper's Eq. 12; 'rdp': RDP with privfed's orders and
    the Balle et al. conversion; 'pld'), exact search: eps(R_c) <= target < eps(R_c + 1)."""
    if accountant == "ali-eq12":
        return accounting.ali_max_steps(target_epsilon, delta, sample_rate, noise_multiplier, search="exact")
    if accountant in ("rdp", "pld"):
        return accounting.max_steps(target_epsilon, delta, sample_rate, noise_multiplier, accountant=accountant)
    raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(ACCOUNTANTS)}")


def batch_estimate(sample_rate: float, dataset_sizes: Iterable[int]) -> float:
    """B-hat = max(1, q * min_i |D_i|): never 0, a float (not truncated)."""
    sizes = [int(n) for n in dataset_sizes]
    if not sizes:
        raise ValueError("B-hat needs at least one client's dataset size")
    return max(1.0, float(sample_rate) * min(sizes))


def horizon(rounds: int, tau_prev: int, iteration_budget_: int) -> int:
    """T = min(R_s * tau*_prev, R_c)."""
    return max(1, min(int(rounds) * int(tau_prev), int(iteration_budget_)))


def optimal_tau(mu: float, clip: float, gamma: float, horizon_: float, noise_multiplier: float,
                num_params: int, batch: float) -> float:
    """Eq. (9) of the paper (unrounded)."""
    if not mu > 0:
        raise ValueError(f"Eq. 9 needs mu > 0 (4/mu^2); got {mu}")
    if not clip > 0 or not batch > 0 or not horizon_ > 0 or num_params <= 0:
        raise ValueError("Eq. 9 needs C > 0, B-hat > 0, T > 0 and d > 0")
    c2 = clip * clip
    noise = noise_multiplier ** 2 * c2 * num_params / batch ** 2
    numerator = 4.0 / mu / mu + 3.0 * c2 + 2.0 * gamma * horizon_ * mu + noise  # / mu / mu: inf, never 1 / 0
    denominator = (2.0 + 1.0 / horizon_) * (c2 + noise)
    return math.sqrt(1.0 + numerator / denominator)


def round_tau(tau: float, tau_max: int) -> int:
    """Half-up rounding (int(x + 0.5), as the authors' code), clamped to [1, tau_max]."""
    if not math.isfinite(tau):
        return int(tau_max)
    return max(1, min(int(tau_max), int(tau + 0.5)))


def plan_round(tau_star: int, steps_done: int, round_index: int, rounds: int, iteration_budget_: int,
               spend_budget: bool = True, behind: int = 0) -> int:
    """Local steps of round `round_index` (1-based) given `steps_done` = t so far.

    0: no budget or no round left (stop). R_s >= R_c: 1 (Lemma 1). Otherwise
    tau*, raised to ceil((R_c - t) / rounds left) when `spend_budget` (so the
    run ends with the budget spent when R_s < R_c). Plus `behind`, the steps a client is behind the
    others after a fault; always capped at R_c - t."""
    left = int(iteration_budget_) - int(steps_done)
    rounds_left = int(rounds) - int(round_index) + 1
    if left <= 0 or rounds_left <= 0:
        return 0
    tau = (1 if rounds >= iteration_budget_ else max(1, int(tau_star))) + int(behind)
    if spend_budget:
        tau = max(tau, -(-left // rounds_left))
    return min(tau, left)
