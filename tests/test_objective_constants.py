"""Thm 6.3's constants u1 and u2 must bound the per-record gradient and Hessian of the model objective perturbation
trains (`logreg`: softmax cross-entropy with a bias), under the theorem's ||x|| <= 1 (review of session 17)."""

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from common.config import SCHEMA, load_preset
from common.models import build_model

REPO = Path(__file__).resolve().parents[1]


def _logreg_point(dim: int = 20, classes: int = 2):
    """The only model objective perturbation may train (`logreg`: Linear(d, C) with bias, softmax CE),
    at a feature vector of norm exactly 1 (Thm 6.3's normalisation)."""
    torch.manual_seed(0)
    model = build_model("logreg", (dim,), classes)
    x = torch.randn(1, dim, dtype=torch.float32)
    x = x / x.norm()
    return model, x


def _flat_grad(model, x, y):
    params = [p for p in model.parameters()]
    loss = F.cross_entropy(model(x), torch.tensor([y]))
    grads = torch.autograd.grad(loss, params)
    return torch.cat([g.reshape(-1) for g in grads])


def test_objective_u1_default_bounds_the_per_example_gradient_of_the_logreg_model():
    """Thm 6.3 needs ||grad F_hat(w; d)|| < u1 for every record (the sensitivity of grad F_i is 2 u1/|D_i|,
    Eq. 17). For privfed's `logreg` (two logits and a bias) with ||x|| <= 1 the per-example gradient is
    (p - e_y) (x) [x; 1], whose norm tends to sqrt(2) * sqrt(2) = 2 as p_y -> 0, not 1 (the bound of a
    scalar logistic loss without bias). The default u1 (and the shipped objective preset's) must bound it."""
    model, x = _logreg_point()
    with torch.no_grad():  # a model confidently wrong about label 0: p_0 -> 0
        model[1].weight.zero_()
        model[1].bias.copy_(torch.tensor([-20.0, 20.0]))
    norm = float(_flat_grad(model, x, 0).norm())
    assert norm > 1.99  # the supremum 2 is approached
    assert SCHEMA["objective-u1"].default >= norm
    assert float(load_preset(REPO / "presets" / "upcycled-objective.toml")["objective-u1"]) >= norm


def test_objective_u2_default_bounds_the_per_example_hessian_of_the_logreg_model():
    """Thm 6.3 needs |F_hat''| <= u2 (the Jacobian-determinant step, Eq. 19, uses the eigenvalues of the
    per-record Hessian). For `logreg` with two logits and a bias the per-record Hessian is
    p(1-p) v v^T with v = [1, -1] (x) [x; 1]: its eigenvalue is p(1-p) * 2 * (||x||^2 + 1) = 1 at
    p = 1/2 and ||x|| = 1, four times the default u2 = 1/4 (a scalar logistic loss's bound)."""
    model, x = _logreg_point()
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.zero_()  # p = (1/2, 1/2)
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]).requires_grad_(True)

    def loss_of(theta):
        w = theta[:40].reshape(2, 20)
        b = theta[40:]
        return F.cross_entropy(x @ w.t() + b, torch.tensor([0]))

    hessian = torch.autograd.functional.hessian(loss_of, flat)
    top = float(torch.linalg.eigvalsh(hessian.double()).max())
    assert math.isclose(top, 1.0, rel_tol=1e-5)
    assert SCHEMA["objective-u2"].default >= top - 1e-6
    assert float(load_preset(REPO / "presets" / "upcycled-objective.toml")["objective-u2"]) >= top - 1e-6

