"""client/updates/batch_gradient.py falls back to autograd wherever autograd would do something else than the
plain layers (hooks, autocast, a frozen parameter, another weight layout), and sgd_step handles a momentum
buffer created late (review of session 16)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import client.updates.batch_gradient as bg
from client.updates.sgd import sgd_step
from common.models import build_model


def autograd_reference(model, params, xb, yb):
    loss = F.cross_entropy(model(xb), yb)
    return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g)


def assert_same(got, ref):
    loss, grads = got
    ref_loss, ref_grads = ref
    assert loss.dtype == ref_loss.dtype and torch.equal(loss, ref_loss)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == r.dtype and g.shape == r.shape and torch.equal(g, r)


def _hook_forward(model):
    return model.register_forward_hook(lambda mod, args, out: out / 2)


def _hook_pre_linear(model):
    return model[1].register_forward_pre_hook(lambda mod, args: (args[0] * 0.5,))


def _hook_weight_tensor(model):
    return model[1].weight.register_hook(lambda g: torch.zeros_like(g))  # e.g. a gradient mask


def _hook_global(model):
    return nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out * 2 if isinstance(mod, nn.Linear) else None)


@pytest.mark.parametrize("hook", [_hook_forward, _hook_pre_linear, _hook_weight_tensor, _hook_global],
                         ids=["model-forward-hook", "linear-pre-hook", "weight-tensor-hook", "global-forward-hook"])
def test_logreg_with_hooks_gets_the_gradient_autograd_gives(hook):
    torch.manual_seed(0)
    model = build_model("logreg", (12,), 4)
    params = list(model.parameters())
    xb, yb = batch()
    handle = hook(model)
    try:
        got = bg.batch_gradient(model, params, yb)(xb, yb)
        ref = autograd_reference(model, params, xb, yb)
    finally:
        handle.remove()
    assert_same(got, ref)


def test_logreg_with_a_frozen_parameter_among_params_is_refused_as_autograd_does():
    """pfedme_update passes every named parameter (frozen ones too): autograd refuses to differentiate a
    tensor that does not require grad; the by-hand path returns a gradient and the frozen bias gets trained."""
    torch.manual_seed(0)
    model = build_model("logreg", (12,), 4)
    model[1].bias.requires_grad_(False)
    params = list(model.parameters())  # as pfedme.py builds it: names from parameters_copy (all parameters)
    xb, yb = batch()
    with pytest.raises(RuntimeError):
        autograd_reference(model, params, xb, yb)
    with pytest.raises(RuntimeError):
        bg.batch_gradient(model, params, yb)(xb, yb)


def test_logreg_under_cpu_autocast_matches_autograd():
    torch.manual_seed(0)
    model = build_model("logreg-softmax", (12,), 4)
    params = list(model.parameters())
    xb, yb = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = bg.batch_gradient(model, params, yb)(xb, yb)
        ref = autograd_reference(model, params, xb, yb)
    assert_same(got, ref)  # autograd: float32 loss and gradients (cross_entropy autocasts up); by hand: bfloat16


def test_logreg_with_a_non_contiguous_weight_is_bit_identical_to_autograd():
    torch.manual_seed(0)
    model = build_model("logreg", (60,), 10)
    model[1].weight.data = model[1].weight.data.t().contiguous().t()  # same values, column-major storage
    params = list(model.parameters())
    g = torch.Generator().manual_seed(1)
    xb, yb = 3 * torch.randn(32, 60, generator=g), torch.randint(0, 10, (32,), generator=g)
    got = bg.batch_gradient(model, params, yb)(xb, yb)
    ref = autograd_reference(model, params, xb, yb)
    assert_same(got, ref)
    assert got[1][0].stride() == ref[1][0].stride()


def test_sgd_step_momentum_when_a_parameter_first_gets_a_gradient_later_matches_torch_optim():
    """sgd_step's docstring: a None gradient is skipped as torch.optim does. A parameter with no gradient on
    the first step (buffer None) and one on the next must not crash the multi-tensor path."""
    w = [torch.zeros(3), torch.zeros(3)]
    ref = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3))]
    opt = torch.optim.SGD(ref, lr=0.1, momentum=0.5)
    g1, g2 = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -1.0, 2.0])
    buffers = sgd_step(w, [None, g1], None, 0.1, 0.5)
    ref[0].grad, ref[1].grad = None, g1.clone()
    opt.step()
    buffers = sgd_step(w, [g2, g2], buffers, 0.1, 0.5)
    ref[0].grad, ref[1].grad = g2.clone(), g2.clone()
    opt.step()
    assert all(torch.equal(a, b.detach()) for a, b in zip(w, ref))
