"""Gradient-matching distance of FedLAP-DP (paper Eq. 10-11).

    L_dis(G^D, G^S) = sum_l [ d(G^D_l, G^S_l) ] + lambda * sum_l ||G^D_l - G^S_l||_2^2

with d the row-wise cosine distance of one parameter tensor: conv weights
[out, in, h, w] and linear weights [out, in] are read as `out` rows; a 1-D
tensor (bias, GroupNorm gamma/beta) is one row.

Normalisation (a choice; the paper's Eq. 10 sums over rows): for tensors with
rows we take the **mean** over rows, 1 - <a_i, b_i> / ((||a_i|| + 1e-8)
(||b_i|| + 1e-8)), as the authors' `distance_wb` does. Why: with a sum, wide
layers (128 output rows) would weigh 128x more than a bias and the cosine part
would scale with the width, which changes what lambda = 0.1 means; the
published lambda and image learning rate (tau = 100) were tuned with the mean,
so the mean reproduces the published behaviour. Each tensor's cosine term is in
[0, 2]. The squared-L2 term is summed over all coordinates (no normalisation),
exactly lambda * sum_l ||.||^2.
"""

from __future__ import annotations

from typing import Sequence

import torch

EPS = 1e-8


def rowwise_cosine_distance(real: torch.Tensor, syn: torch.Tensor) -> torch.Tensor:
    """d(A, B) for one parameter tensor: mean over rows of 1 - cos (1-D: one row, no mean)."""
    if real.shape != syn.shape:
        raise ValueError(f"gradient shapes differ: {tuple(real.shape)} vs {tuple(syn.shape)}")
    if real.dim() <= 1:
        a, b = real.reshape(1, -1), syn.reshape(1, -1)
    else:
        a, b = real.reshape(real.shape[0], -1), syn.reshape(syn.shape[0], -1)
    cos = (a * b).sum(dim=1) / ((a.norm(dim=1) + EPS) * (b.norm(dim=1) + EPS))
    return (1.0 - cos).mean() if real.dim() > 1 else (1.0 - cos).sum()


def matching_distance(real: Sequence[torch.Tensor], syn: Sequence[torch.Tensor],
                      mse_weight: float = 0.1) -> torch.Tensor:
    """L_dis over all parameter tensors: sum of row-wise cosine distances + mse_weight * squared L2."""
    if len(real) != len(syn):
        raise ValueError(f"{len(real)} real gradients but {len(syn)} synthetic ones")
    total = syn[0].new_zeros(())
    for g_real, g_syn in zip(real, syn):
        g_real = g_real.detach()
        total = total + rowwise_cosine_distance(g_real, g_syn)
        if mse_weight:
            total = total + mse_weight * (g_syn - g_real).pow(2).sum()
    return total
