"""DSA-style differentiable augmentation (Zhao & Bilen 2021), as FedLAP uses it.

`augment(x, seed)` applies ONE operation, chosen by `seed` from
color / crop / cutout / flip / scale / rotate, with parameters drawn from the
same seed, to the whole batch ("batch mode": every image gets the same
parameters). The same seed gives the same transform for the real and the
synthetic batch of a matching step, whatever their sizes, which is what
"applied identically" needs. Every op is differentiable in x (affine grids
with bilinear sampling, masks, affine colour maps), so image gradients flow
through it.

Constants follow the DSA defaults the authors use: scale 1.2, rotate 15 deg,
crop (translation) 0.125, cutout 0.5, flip 0.5, brightness 1.0, saturation
2.0, contrast 0.5. The augmentation parameters never depend on data, so under
DP they are part of the mechanism's public randomness.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

OPS = ("color", "crop", "cutout", "flip", "scale", "rotate")
SCALE, ROTATE, CROP, CUTOUT, FLIP = 1.2, 15.0, 0.125, 0.5, 0.5
BRIGHTNESS, SATURATION, CONTRAST = 1.0, 2.0, 0.5


def _affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3).to(x), list(x.shape), align_corners=True)
    return F.grid_sample(x, grid, align_corners=True)


def _color(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    b, s, c = torch.rand(3, generator=g).tolist()
    x = x + (b - 0.5) * BRIGHTNESS
    mean = x.mean(dim=1, keepdim=True)
    x = (x - mean) * (s * SATURATION) + mean
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * (c + CONTRAST) + mean


def _crop(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    # translate by up to CROP of the size (zero padding), as DSA's crop
    tx, ty = ((torch.rand(2, generator=g) * 2 - 1) * CROP * 2).tolist()
    theta = torch.tensor([[1.0, 0.0, tx], [0.0, 1.0, ty]])
    return _affine(x, theta)


def _cutout(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    h, w = x.shape[-2:]
    ch, cw = int(h * CUTOUT + 0.5), int(w * CUTOUT + 0.5)
    cy = int(torch.randint(0, h + 1 - ch % 2, (1,), generator=g))
    cx = int(torch.randint(0, w + 1 - cw % 2, (1,), generator=g))
    mask = torch.ones(h, w, dtype=x.dtype, device=x.device)
    mask[max(cy - ch // 2, 0): min(cy + ch // 2, h), max(cx - cw // 2, 0): min(cx + cw // 2, w)] = 0
    return x * mask


def _flip(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return x.flip(-1) if float(torch.rand(1, generator=g)) < FLIP else x


def _scale(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    sx, sy = (torch.rand(2, generator=g) * (SCALE - 1 / SCALE) + 1 / SCALE).tolist()
    return _affine(x, torch.tensor([[sx, 0.0, 0.0], [0.0, sy, 0.0]]))


def _rotate(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    a = (float(torch.rand(1, generator=g)) - 0.5) * 2 * ROTATE / 180 * math.pi
    return _affine(x, torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]))


_FN = {"color": _color, "crop": _crop, "cutout": _cutout, "flip": _flip, "scale": _scale, "rotate": _rotate}


def augment(x: torch.Tensor, seed: int, ops: tuple[str, ...] = OPS) -> torch.Tensor:
    """One seeded op from `ops` on the batch x [n, c, h, w]; same seed, same transform."""
    if x.dim() != 4:  # flat features (Synthetic, Adult) have no geometry to transform
        raise ValueError(f"DSA augmentation needs image batches [n, c, h, w], got shape {tuple(x.shape)}: "
                         "set fedlap-dsa = false for non-image data")
    if len(x) == 0:
        return x
    g = torch.Generator().manual_seed(int(seed))
    op = ops[int(torch.randint(0, len(ops), (1,), generator=g))]
    return _FN[op](x, g)
