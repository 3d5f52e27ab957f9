"""Upcycled-FL mechanisms: clipping, output perturbation, objective-perturbation noise."""

import math

import pytest
import torch
from scipy import stats

from common.privacy.mechanisms import (
    add_gaussian_noise,
    clip_by_l2_norm,
    l2_norm,
    linear_objective_term,
    objective_noise_like,
    output_perturbation,
    sample_objective_noise,
)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_clip_scales_down_only_above_tau():
    t = [torch.full((3, 4), 2.0), torch.full((5,), -1.0)]
    norm = math.sqrt(12 * 4 + 5)
    clipped, before = clip_by_l2_norm(t, 1.5)
    assert before == pytest.approx(norm)
    assert l2_norm(clipped) == pytest.approx(1.5, rel=1e-6)
    assert torch.allclose(clipped[0], t[0] * 1.5 / norm)
    same, _ = clip_by_l2_norm(t, 100.0)
    assert all(torch.equal(a, b) for a, b in zip(same, t))
    sd = {"w": torch.ones(4), "steps": torch.tensor(7)}  # integer buffers pass through
    out, _ = clip_by_l2_norm(sd, 1.0)
    assert set(out) == {"w", "steps"} and out["steps"].item() == 7
    assert l2_norm([out["w"]]) == pytest.approx(1.0)


def test_output_perturbation_std_is_sigma_not_sigma_squared():
    """The authors' code draws torch.normal(0, sigma**2): std 0.64 for sigma 0.8. Ours is 0.8."""
    sigma = 0.8
    zeros = [torch.zeros(200_000)]
    noisy = output_perturbation(zeros, clip_norm=10.0, noise_std=sigma, generator=_gen(1))
    std = noisy[0].std().item()
    assert std == pytest.approx(sigma, rel=0.01)
    assert abs(std - sigma**2) > 0.1


def test_output_perturbation_model_and_update_modes():
    model = {"a": torch.full((10,), 3.0), "b": torch.full((6,), 4.0)}
    clipped = output_perturbation(model, clip_norm=2.0, noise_std=0.0)
    assert l2_norm(clipped) == pytest.approx(2.0, rel=1e-6)
    ref = {"a": torch.full((10,), 2.9), "b": torch.full((6,), 4.0)}
    upd = output_perturbation(model, clip_norm=0.1, noise_std=0.0, reference=ref)
    delta = [upd[k] - ref[k] for k in ref]
    assert l2_norm(delta) == pytest.approx(0.1, rel=1e-4)  # update clipped, model = ref + clipped update
    a = output_perturbation(model, clip_norm=2.0, noise_std=0.5, generator=_gen(3))
    b = output_perturbation(model, clip_norm=2.0, noise_std=0.5, generator=_gen(3))
    assert all(torch.equal(a[k], b[k]) for k in a)  # reproducible from the generator


def test_output_perturbation_pairs_the_reference_by_name():
    """A server may send the model's arrays in another order (load_arrays loads by name): the update
    w - w_global was paired by position, subtracting the bias from the weight, and the node crashed after
    charging its ledger (review of session 19)."""
    model = {"w": torch.full((5,), 1.0), "b": torch.full((3,), 2.0)}
    ref = {"b": torch.full((3,), 1.5), "w": torch.full((5,), 0.5)}
    out = output_perturbation(model, clip_norm=100.0, noise_std=0.0, reference=ref)
    assert all(torch.equal(out[k], model[k]) for k in model)
    with pytest.raises(ValueError, match="names"):
        output_perturbation(model, clip_norm=1.0, noise_std=0.0, reference={"w": ref["w"], "c": ref["b"]})


def test_add_gaussian_noise_keeps_dtype_and_shape():
    t = [torch.zeros(3, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.float32)]
    out = add_gaussian_noise(t, 1.0, _gen())
    assert [o.dtype for o in out] == [torch.float64, torch.float32]
    assert [o.shape for o in out] == [t[0].shape, t[1].shape]


def test_objective_noise_norm_is_gamma_d_alpha():
    d, alpha, n = 20, 10.0, 3000
    g = _gen(11)
    norms = torch.stack([sample_objective_noise(d, alpha, g).norm() for _ in range(n)]).numpy()
    # ||n|| ~ Gamma(shape = d, rate = alpha): mean d/alpha, var d/alpha^2
    assert norms.mean() == pytest.approx(d / alpha, rel=0.02)
    assert norms.var() == pytest.approx(d / alpha**2, rel=0.1)
    assert stats.kstest(norms, stats.gamma(a=d, scale=1 / alpha).cdf).pvalue > 0.01
    # not the authors' shape (the input dimension, e.g. 784 for FEMNIST's 155,830 parameters)
    assert stats.kstest(norms, stats.gamma(a=d / 2, scale=1 / alpha).cdf).pvalue < 1e-6


def test_objective_noise_direction_is_uniform():
    g = _gen(12)
    n = 3000
    u3 = torch.stack([sample_objective_noise(3, 1.0, g) for _ in range(n)])
    u3 = u3 / u3.norm(dim=1, keepdim=True)
    # Archimedes: each coordinate of a uniform point on S^2 is uniform on [-1, 1]
    for i in range(3):
        assert stats.kstest(u3[:, i].numpy(), stats.uniform(loc=-1, scale=2).cdf).pvalue > 0.01
    d = 50
    ud = torch.stack([sample_objective_noise(d, 1.0, g) for _ in range(n)])
    ud = ud / ud.norm(dim=1, keepdim=True)
    assert ud.mean(0).norm().item() < 4 / math.sqrt(n)  # E[u] = 0
    second = (ud.T @ ud / n).numpy()  # E[u u^T] = I / d
    assert abs(second.diagonal().mean() - 1 / d) < 1e-3
    assert abs(second - (1 / d) * torch.eye(d).numpy()).max() < 0.01
    # and not the cube-uniform direction of the authors' code: corners are over-represented there
    cube = torch.rand(n, 3, generator=g) * 2 - 1
    cube = cube / cube.norm(dim=1, keepdim=True)
    assert stats.kstest(cube[:, 0].numpy(), stats.uniform(loc=-1, scale=2).cdf).pvalue < 0.01


def test_objective_noise_in_model_dimension():
    params = [torch.zeros(196, 784), torch.zeros(196), torch.zeros(10, 196), torch.zeros(10)]
    d = sum(p.numel() for p in params)  # 155,830 (FEMNIST MLP)
    alpha = 200.0
    noise = objective_noise_like(params, alpha, _gen(5))
    assert [x.shape for x in noise] == [p.shape for p in params]
    r = l2_norm(noise)
    assert abs(r - d / alpha) < 5 * math.sqrt(d) / alpha  # Gamma(d, alpha): mean d/alpha, sd sqrt(d)/alpha
    w = [torch.randn_like(p, requires_grad=True) for p in params]
    term = linear_objective_term(w, noise)
    grads = torch.autograd.grad(term, w)
    assert all(torch.allclose(gr, n) for gr, n in zip(grads, noise))  # d<n, w>/dw = n


def test_invalid_mechanism_arguments():
    with pytest.raises(ValueError):
        clip_by_l2_norm([torch.ones(2)], 0.0)
    with pytest.raises(ValueError):
        sample_objective_noise(0, 1.0)
    with pytest.raises(ValueError):
        sample_objective_noise(5, -1.0)
