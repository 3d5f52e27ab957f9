"""client/updates/batch_gradient.py: logistic regression's loss and gradient from its kernels, called by hand,
are bit-identical to autograd's; every other model goes through autograd."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import client.updates.batch_gradient as bg
from client.updates.corrected import train_corrected
from common.models import build_model


def autograd_reference(model, xb, yb):
    params = [p for p in model.parameters() if p.requires_grad]
    loss = F.cross_entropy(model(xb), yb)
    return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)


def is_by_hand(gradient) -> bool:
    return getattr(gradient, "func", None) is bg._logreg_gradient


@pytest.mark.parametrize("name", ["logreg", "logreg-softmax"])
@pytest.mark.parametrize("shape", [(60,), (1, 6, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logistic_regression_matches_autograd_bit_for_bit(name, shape, dtype):
    torch.manual_seed(0)
    model = build_model(name, shape, 10).to(dtype)
    params = list(model.parameters())
    gradient = bg.batch_gradient(model, params, torch.zeros(1, dtype=torch.long))
    assert is_by_hand(gradient)
    for batch in (32, 7, 1):
        xb = 3 * torch.randn(batch, *shape, dtype=dtype)
        yb = torch.randint(0, 10, (batch,))
        loss, grads = gradient(xb, yb)
        ref_loss, ref_grads = autograd_reference(model, xb, yb)
        assert torch.equal(loss, ref_loss)
        assert not loss.requires_grad
        for g, ref in zip(grads, ref_grads):
            assert g.shape == ref.shape and torch.equal(g, ref)


@pytest.mark.parametrize("model", [
    nn.Sequential(nn.Flatten(), nn.Linear(8, 3, bias=False)),
    nn.Sequential(nn.Flatten(), nn.Linear(8, 3), nn.Softmax(dim=0)),
    nn.Sequential(nn.Flatten(), nn.Linear(8, 3), nn.ReLU()),
    nn.Sequential(nn.Linear(8, 3)),
    nn.Sequential(nn.Flatten(), nn.Linear(8, 8), nn.Linear(8, 3)),
], ids=["no-bias", "softmax-dim0", "relu", "no-flatten", "two-linear"])
def test_other_models_go_through_autograd(model):
    params = list(model.parameters())
    xb, yb = torch.randn(5, 8), torch.randint(0, 3, (5,))
    gradient = bg.batch_gradient(model, params, yb)
    assert not is_by_hand(gradient)
    xb, yb = torch.randn(5, 8), torch.randint(0, 3, (5,))
    loss, grads = gradient(xb, yb)
    ref_loss, ref_grads = autograd_reference(model, xb, yb)
    assert torch.equal(loss, ref_loss) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def test_a_frozen_bias_goes_through_autograd():
    model = build_model("logreg", (8,), 3)
    model[1].bias.requires_grad_(False)
    gradient = bg.batch_gradient(model, [model[1].weight], torch.zeros(1, dtype=torch.long))
    assert not is_by_hand(gradient)
    _, grads = gradient(torch.randn(4, 8), torch.randint(0, 3, (4,)))
    assert len(grads) == 1 and grads[0].shape == (3, 8)


def test_class_probability_labels_go_through_autograd():
    model = build_model("logreg-softmax", (8,), 3)
    yb = torch.softmax(torch.randn(4, 3), 1)
    gradient = bg.batch_gradient(model, list(model.parameters()), yb)
    assert not is_by_hand(gradient)
    xb = torch.randn(4, 8)
    loss, grads = gradient(xb, yb)
    ref_loss, ref_grads = autograd_reference(model, xb, yb)
    assert torch.equal(loss, ref_loss) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def test_corrected_loop_is_unchanged_by_the_kernels_by_hand(monkeypatch):
    """FedProx-style training with momentum and gradient clipping: the same weights and loss whether the
    gradients come from the kernels by hand or from autograd."""
    x, y = torch.randn(90, 60), torch.randint(0, 10, (90,))

    def run():
        torch.manual_seed(3)
        model = build_model("logreg-softmax", (60,), 10)
        anchor = {k: v.detach().clone() for k, v in model.named_parameters()}

        def proximal(params, grads):
            for name, g in grads.items():
                g.add_(params[name] - anchor[name], alpha=0.1)
        loss, steps = train_corrected(model, x, y, epochs=3, batch_size=32, lr=0.5, momentum=0.5,
                                      generator=torch.Generator().manual_seed(1), correction=proximal,
                                      max_grad_norm=0.05)
        return loss, steps, model.state_dict()

    by_hand = run()
    monkeypatch.setattr(bg, "_logistic_regression", lambda model: (None, False))
    autograd = run()
    assert by_hand[:2] == autograd[:2] and by_hand[1] == 9
    assert all(torch.equal(by_hand[2][k], autograd[2][k]) for k in by_hand[2])
