"""Upcycled-FL's mechanisms as pure tensor functions.

Tensors come as a list of tensors or a dict name -> tensor (a state dict); the
result has the same shape. Norms are the global L2 norm over all tensors (the
authors' code clips the whole state dict at once). Randomness comes from an
explicit `torch.Generator`, so private runs are reproducible (the authors'
code reseeds from the clock).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

import torch

Tensors = TypeVar("Tensors", list[torch.Tensor], dict[str, torch.Tensor])


def _values(tensors: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    return list(tensors.values()) if isinstance(tensors, Mapping) else list(tensors)


def _rebuild(like: Sequence[torch.Tensor] | Mapping[str, torch.Tensor], values: list[torch.Tensor]):
    if isinstance(like, Mapping):
        return dict(zip(like.keys(), values))
    return values


def l2_norm(tensors: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]) -> float:
    """Global L2 norm of all tensors together (computed in float64)."""
    total = sum(float(t.detach().double().pow(2).sum()) for t in _values(tensors))
    return math.sqrt(total)


def clip_by_l2_norm(tensors: Tensors, clip_norm: float) -> tuple[Tensors, float]:
    """xi(w) = w / max(1, ||w||_2 / tau): scale down to norm `clip_norm` (tau) if
    larger. Returns (clipped tensors, the norm before clipping). Floating-point
    tensors only; integer buffers (e.g. counters) are passed through unchanged."""
    if not clip_norm > 0:
        raise ValueError(f"clip norm must be positive; got {clip_norm}")
    values = _values(tensors)
    floats = [t for t in values if t.is_floating_point()]
    norm = l2_norm(floats)
    if not math.isfinite(norm):  # max(1, NaN / tau) is 1: a NaN norm would release the input unclipped
        raise ValueError(f"cannot clip a vector whose L2 norm is {norm}")
    scale = 1.0 / max(1.0, norm / clip_norm)
    out = [t.detach() * scale if t.is_floating_point() else t.detach().clone() for t in values]
    while scale < 1.0 and l2_norm([t for t in out if t.is_floating_point()]) > clip_norm:
        scale *= 1.0 - 2.0**-20  # float32 rounding of the scaled coordinates: the bound must hold exactly
        out = [t.detach() * scale if t.is_floating_point() else t.detach().clone() for t in values]
    return _rebuild(tensors, out), norm


def add_gaussian_noise(tensors: Tensors, noise_std: float, generator: torch.Generator | None = None) -> Tensors:
    """w + N(0, noise_std^2 I): `noise_std` is the standard deviation (the
    authors' Upcycled-FL code passes sigma**2 as the std; we do not)."""
    if noise_std < 0:
        raise ValueError(f"noise std must be non-negative; got {noise_std}")
    out = []
    for t in _values(tensors):
        if not t.is_floating_point():
            out.append(t.detach().clone())
            continue
        noise = torch.randn(t.shape, generator=generator, dtype=t.dtype, device=t.device)
        out.append(t.detach() + noise_std * noise)
    return _rebuild(tensors, out)


def output_perturbation(tensors: Tensors, *, clip_norm: float, noise_std: float,
                        reference: Tensors | None = None, generator: torch.Generator | None = None) -> Tensors:
    """Upcycled-FL output perturbation: xi(w) + N(0, sigma^2 I) with sigma = `noise_std`.

    Without `reference` the model itself is clipped and noised (the paper). With
    `reference` (the global model the round started from) the update
    w - reference is clipped and noised and reference + noisy update is returned.
    The ledger entry is `events.output_perturbation_release(clip_norm, noise_std, |D_i|)`."""
    if reference is None:
        clipped, _ = clip_by_l2_norm(tensors, clip_norm)
        return add_gaussian_noise(clipped, noise_std, generator)
    values = _values(tensors)
    if isinstance(tensors, Mapping) and isinstance(reference, Mapping):  # by name: the order may differ
        if tensors.keys() != reference.keys():
            raise ValueError("model and reference have different tensor names")
        refs = [reference[k] for k in tensors]
    else:
        refs = _values(reference)
    if len(values) != len(refs):
        raise ValueError("model and reference have different numbers of tensors")
    delta = [v.detach() - r.detach() if v.is_floating_point() else v.detach().clone() for v, r in zip(values, refs)]
    clipped, _ = clip_by_l2_norm(delta, clip_norm)
    noisy = add_gaussian_noise(clipped, noise_std, generator)
    out = [r.detach() + d if v.is_floating_point() else v.detach().clone() for v, r, d in zip(values, refs, noisy)]
    return _rebuild(tensors, out)


def sample_objective_noise(dim: int, alpha: float, generator: torch.Generator | None = None,
                           dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A draw n in R^dim with density proportional to exp(-alpha ||n||_2).

    In polar coordinates the density of r = ||n|| is proportional to
    r^(dim-1) exp(-alpha r), i.e. r ~ Gamma(shape=dim, rate=alpha), and the
    direction is uniform on the sphere, independent of r. For integer dim,
    Gamma(dim, alpha) is the sum of dim independent Exp(alpha) variables, which
    we draw as -log(U)/alpha (exact, and it uses `generator`); the direction is a
    normalised standard Gaussian vector. (The authors' code draws the norm with
    shape = the input dimension and a cube-uniform direction; both are wrong for
    a model of dimension d.)"""
    dim = int(dim)
    if dim <= 0:
        raise ValueError(f"dimension must be positive; got {dim}")
    if not alpha > 0:
        raise ValueError(f"alpha must be positive; got {alpha}")
    u = torch.rand(dim, generator=generator, dtype=torch.float64)
    radius = -torch.log1p(-u).sum() / alpha  # 1 - U is uniform on (0, 1]; log1p(-u) is finite
    direction = torch.randn(dim, generator=generator, dtype=torch.float64)
    direction = direction / direction.norm()
    return (radius * direction).to(dtype)


def objective_noise_like(params: Tensors, alpha: float, generator: torch.Generator | None = None) -> Tensors:
    """`sample_objective_noise` in the model's own dimension d (all floating
    tensors together), reshaped like `params`. The linear term <n, w> of the
    local objective has gradient n: add it to every local step's gradient."""
    values = _values(params)
    sizes = [t.numel() for t in values]
    flat = sample_objective_noise(sum(sizes), alpha, generator)
    out, i = [], 0
    for t, k in zip(values, sizes):
        out.append(flat[i:i + k].reshape(t.shape).to(dtype=t.dtype, device=t.device))
        i += k
    return _rebuild(params, out)


def linear_objective_term(params: Sequence[torch.Tensor], noise: Sequence[torch.Tensor]) -> torch.Tensor:
    """<n, w> summed over tensors: the objective-perturbation term, differentiable in w."""
    return sum((n.to(p.dtype) * p).sum() for p, n in zip(params, noise))
