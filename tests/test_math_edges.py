"""Invariants of privfed's pure math at the edges of what config accepts: the smallest calibrated sigma,
Eq. 9 for a tiny mu, theta_m for a huge growth exponent, a clip that holds in float32. Each test is a
violation an adversarial review found by seeded random search (session 12).
"""

from __future__ import annotations

import pytest
import torch

from common.config import validate
from common.privacy import accounting, ali
from common.privacy.mechanisms import clip_by_l2_norm, l2_norm, output_perturbation
from server.strategies.upcycled import theta_schedule


# --- calibrate_noise_multiplier: "the smallest noise multiplier on the grid of multiples of tol" ------------
@pytest.mark.parametrize("target, q, steps, tol", [
    (1.0, 0.002, 200, 1e-4),   # default tol: returns 0.8854, but 0.8853 already gives epsilon 0.99999 <= 1
    (5.0, 0.001, 1000, 1e-2),  # returns 0.49, but 0.48 already gives epsilon 4.967 <= 5
])
def test_calibrated_sigma_is_the_smallest_grid_point_meeting_the_target(target, q, steps, tol):
    delta = 1e-5
    sigma = accounting.calibrate_noise_multiplier(target, delta, q, steps, tol=tol)
    assert accounting.dpsgd_epsilon(q, sigma, steps, delta) <= target
    one_below = float(f"{sigma - tol:.12g}")
    eps_below = accounting.dpsgd_epsilon(q, one_below, steps, delta)
    assert eps_below > target, (
        f"sigma = {sigma} is not the smallest multiple of tol = {tol} meeting epsilon <= {target}: "
        f"sigma = {one_below} gives epsilon {eps_below}")


# --- ALI-DPFL Eq. 9: finite (or clamped) for every mu the config's clamp allows -------------------------------
def test_eq9_tau_for_a_tiny_mu_inside_the_configured_clamp_is_tau_max_not_a_crash():
    # ali-mu-min only has to be > 0; every mu estimate is clamped to [ali-mu-min, ali-mu-max] and fed to Eq. 9
    config = validate({"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 2.0,
                       "ali-mu-min": 1e-200})
    mu = float(config["ali-mu-min"])
    tau_max = int(config["ali-tau-max"])
    # 4/mu^2 -> +inf: tau* grows without bound as mu -> 0, so the clamp gives tau_max (as it does for mu=1e-154)
    assert ali.round_tau(ali.optimal_tau(1e-154, 0.1, 10.0, 100, 1.1, 1000, 5.0), tau_max) == tau_max
    tau = ali.optimal_tau(mu, 0.1, 10.0, 100, 1.1, 1000, 5.0)  # ZeroDivisionError: mu**2 underflows to 0.0
    assert ali.round_tau(tau, tau_max) == tau_max


# --- Upcycled-FL theta_m = mu / (mu + lambda m^g): in [0, 1] for every validated (mu, lambda, g) -------------
def test_theta_schedule_with_a_large_growth_exponent_tends_to_zero_instead_of_overflowing():
    config = validate({"upcycled": True, "upcycled-lambda": 1.0, "upcycled-lambda-growth": 1100.0})
    theta = theta_schedule(float(config["upcycled-theta"]), float(config["upcycled-mu"]),
                           float(config["upcycled-lambda"]), float(config["upcycled-lambda-growth"]))
    assert 0.0 <= theta(1) <= 1.0
    value = theta(2)  # float(2) ** 1100 raises OverflowError: the run dies on its 4th server round
    assert 0.0 <= value <= 1e-300


# --- output perturbation: the clipped vector's norm is <= the clip norm the sensitivity is computed from -----
def test_clipped_model_norm_never_exceeds_clip_norm():
    x = [torch.arange(1, 11, dtype=torch.float32)]  # norm 19.62, clipped to 1
    clipped, before = clip_by_l2_norm(x, 1.0)
    assert before > 1.0
    assert l2_norm(clipped) <= 1.0, f"clipped norm {l2_norm(clipped)!r} > clip 1.0"


def test_output_perturbation_update_mode_keeps_the_update_norm_within_clip_norm():
    # output-perturb = "update": the update w - w_global is clipped (and noised); with noise_std = 0 the
    # released update is the clipped one. Randomised float32 updates: about half exceed the clip norm.
    gen = torch.Generator().manual_seed(0)
    over = []
    for _ in range(200):
        n = int(torch.randint(1, 2000, (1,), generator=gen))
        reference = {"w": torch.zeros(n), "b": torch.zeros(3)}
        model = {"w": torch.randn(n, generator=gen) * 100, "b": torch.randn(3, generator=gen)}
        released = output_perturbation(model, clip_norm=1.0, noise_std=0.0, reference=reference)
        norm = l2_norm({k: released[k] - reference[k] for k in released})
        if norm > 1.0:
            over.append(norm)
    assert not over, (f"{len(over)} of 200 clipped float32 updates exceed the clip norm 1.0 "
                      f"(largest {max(over)!r})")
