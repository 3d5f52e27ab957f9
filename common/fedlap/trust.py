"""Trust-region pieces of FedLAP: parameter distance, the cosine learning rate
over rounds, the server's radius vote, and the client's radius calibration."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

RADIUS_RULES = ("min", "max", "median", "fixed")


def param_distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """||flatten(a) - flatten(b)||_2 over all tensors."""
    return math.sqrt(sum(float((x.detach() - y.detach()).pow(2).sum()) for x, y in zip(a, b)))


def cosine_lr(base: float, round_: int, horizon: int, floor: float = 1e-6) -> float:
    """eta_m = max(eta_0 (1 + cos(pi (m-1)/(E-1))) / 2, floor) for round m of E (authors' schedule)."""
    if horizon <= 1:
        return base
    m = min(max(int(round_), 1), horizon)
    return max(base * (1 + math.cos(math.pi * (m - 1) / (horizon - 1))) / 2, floor)


def vote_radius(radii: Sequence[float], rule: str) -> float | None:
    """r_g from the clients' radii: min / max / median; `fixed` (no truncation) gives None."""
    if rule == "fixed":
        return None
    if not radii:
        raise ValueError("no client radius to vote on")
    values = sorted(float(r) for r in radii)
    if rule == "min":
        return values[0]
    if rule == "max":
        return values[-1]
    if rule == "median":
        n = len(values)
        return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    raise ValueError(f"unknown radius rule {rule!r}; known: {', '.join(RADIUS_RULES)}")


def calibrate_radius(step: Callable[[], None], distance: Callable[[], float], real_loss: Callable[[], float],
                     epochs: int, cap: float) -> float:
    """Non-DP r_k: take `epochs` training steps on S_k (`step`), after each read the distance
    from w_g and the loss on real data; r_k = the distance at the smallest real loss, clipped to `cap`."""
    best_loss, best_dist = math.inf, cap
    for _ in range(max(int(epochs), 0)):
        step()
        loss = real_loss()
        if loss < best_loss:
            best_loss, best_dist = loss, distance()
    return min(best_dist, cap)
