"""DP-SGD through Opacus: the step's arithmetic, Poisson sampling, empty batches, models."""

import pytest
import torch
from torch import nn

from common.models import build_model
from common.privacy.dpsgd import (
    GRAD_SAMPLE_MODES,
    DpSgd,
    IncompatibleModelError,
    check_model,
    dpsgd_train,
    make_dp_compatible,
    private_gradient,
)


def _data(n=40, d=6, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)


def _per_sample_clipped_sum(model, x, y, clip):
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        scale = min(1.0, clip / (norm.item() + 1e-6))
        for t, g in zip(total, grads):
            t += g * scale
    model.zero_grad()
    return total


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew", "ghost"])
def test_step_is_clipped_sum_over_expected_batch_size(mode):
    torch.manual_seed(0)
    x, y = _data()
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    ref = [p.detach().clone() for p in model.parameters()]
    clip, lr, q, n = 0.05, 0.5, 0.25, 100  # |D| = 100 -> divisor q|D| = 25, batch of 40
    expected_sum = _per_sample_clipped_sum(model, x, y, clip)
    with DpSgd(model, dataset_size=n, sample_rate=q, max_grad_norm=clip, noise_multiplier=0.0, lr=lr,
               grad_sample_mode=mode) as trainer:
        trainer.step(x, y)
    for p, r, s in zip(model.parameters(), ref, expected_sum):
        assert torch.allclose(p.detach(), r - lr * s / (q * n), atol=1e-6)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_empty_batch_takes_a_noise_only_step(mode):
    model = build_model("logreg", (60,), 10)  # 610 parameters
    ref = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    gen = torch.Generator().manual_seed(1)
    with DpSgd(model, dataset_size=100, sample_rate=0.1, max_grad_norm=2.0, noise_multiplier=1.5, lr=1.0,
               noise_generator=gen, grad_sample_mode=mode) as trainer:
        assert trainer.step(torch.zeros(0, 60), torch.zeros(0, dtype=torch.long)) is None
    moved = torch.cat([p.detach().flatten() for p in model.parameters()]) - ref
    # update = -(N(0, (sigma C)^2)) / (q |D|): std 1.5 * 2 / 10 = 0.3
    assert moved.std().item() == pytest.approx(0.3, rel=0.1)


def test_dpsgd_train_runs_exact_steps_reproducibly_and_cleans_up():
    x, y = _data(n=30)
    results, weights = [], []
    for seed in (7, 7, 8):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Dropout(0.5), nn.Linear(4, 3))
        model.eval()
        r = dpsgd_train(model, x, y, steps=12, sample_rate=0.05, max_grad_norm=1.0, noise_multiplier=1.0,
                        lr=0.1, momentum=0.9, seed=seed)
        results.append(r)
        weights.append([p.detach().clone() for p in model.parameters()])
        assert r.steps == 12
        assert not model.training  # mode restored
        for p in model.parameters():
            assert p.grad is None
            assert not any(hasattr(p, a) for a in ("grad_sample", "summed_grad", "_forward_counter"))
        for m in model.modules():
            assert not m._forward_hooks and not m._backward_hooks and not getattr(m, "_forward_pre_hooks", {})
    assert results[0] == results[1] and all(torch.equal(a, b) for a, b in zip(weights[0], weights[1]))
    assert not all(torch.equal(a, b) for a, b in zip(weights[0], weights[2]))
    # q|D| = 1.5: P(empty) = 0.95^30 = 0.21, so some of the 12 steps are noise-only; all are counted
    assert 0 <= results[0].empty_batches < 12
    assert 0 < results[0].mean_batch_size < 5


def test_all_empty_batches_still_count():
    x, y = _data(n=5)
    model = nn.Linear(6, 3)
    r = dpsgd_train(model, x, y, steps=4, sample_rate=1e-9, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1, seed=0)
    assert r.steps == 4 and r.empty_batches == 4 and r.mean_loss != r.mean_loss  # nan: no loss observed


def test_regularizer_gradient_is_added_after_the_noise():
    x, y = _data(n=20)
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    ref = [p.detach().clone() for p in model.parameters()]
    sums = _per_sample_clipped_sum(model, x, y, 1e6)
    anchor = [torch.zeros_like(p) for p in model.parameters()]
    mu = 0.3

    def prox(m):
        return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(m.parameters(), anchor))

    with DpSgd(model, dataset_size=20, sample_rate=1.0, max_grad_norm=1e6, noise_multiplier=0.0, lr=0.1,
               regularizer=prox) as trainer:
        trainer.step(x, y)
    for p, r, s in zip(model.parameters(), ref, sums):
        assert torch.allclose(p.detach(), r - 0.1 * (s / 20 + mu * r), atol=1e-6)


def test_private_gradient_with_full_batch_and_no_noise():
    x, y = _data(n=16)
    model = nn.Linear(6, 3)
    ref = [p.detach().clone() for p in model.parameters()]
    sums = _per_sample_clipped_sum(model, x, y, 0.1)
    grads = private_gradient(model, x, y, sample_rate=1.0, max_grad_norm=0.1, noise_multiplier=0.0, seed=0)
    for g, s in zip(grads, sums):
        assert torch.allclose(g, s / 16, atol=1e-7)
    assert all(torch.equal(p, r) for p, r in zip(model.parameters(), ref))  # model unchanged


MODELS = [("logreg", (20,), 2), ("femnist-mlp", (1, 28, 28), 10), ("adult-mlp", (14,), 2),
          ("ali-mnist-cnn", (1, 28, 28), 10), ("ali-cifar-cnn", (3, 32, 32), 10), ("convnet", (1, 28, 28), 10)]


@pytest.mark.parametrize("name,shape,classes", MODELS)
def test_every_model_trains_with_dpsgd(name, shape, classes):
    torch.manual_seed(0)
    model = build_model(name, shape, classes)
    check_model(model)
    x, y = torch.randn(8, *shape), torch.randint(0, classes, (8,))
    before = [p.detach().clone() for p in model.parameters()]
    r = dpsgd_train(model, x, y, steps=1, sample_rate=0.25, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.05, seed=3)
    assert r.steps == 1
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_incompatible_model_is_refused_with_a_clear_error():
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    x, y = _data(n=10)
    with pytest.raises(IncompatibleModelError, match="BatchNorm"):
        dpsgd_train(model, x, y, steps=1, sample_rate=0.5, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1)
    fixed = make_dp_compatible(model)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in fixed.modules())
    assert dpsgd_train(fixed, x, y, steps=1, sample_rate=0.5, max_grad_norm=1.0, noise_multiplier=1.0,
                       lr=0.1, seed=0).steps == 1


def test_ghost_clipping_equals_hooks_with_noise_and_cleans_up():
    """Same generator, same step: ghost clipping draws the same noise and returns the same model."""
    x, y = _data(n=64, d=10, k=2)
    models = []
    for mode in ("hooks", "ghost"):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 2))
        with DpSgd(model, dataset_size=64, sample_rate=1.0, max_grad_norm=0.3, noise_multiplier=0.7, lr=0.5,
                   momentum=0.5, grad_sample_mode=mode, noise_generator=torch.Generator().manual_seed(5)) as t:
            losses = [t.step(x[i:i + 32], y[i:i + 32]) for i in (0, 32, 0)]
        models.append((losses, [p.detach().clone() for p in model.parameters()]))
        for p in model.parameters():
            assert p.grad is None and not hasattr(p, "_norm_sample") and not hasattr(p, "grad_sample")
        for m in model.modules():
            assert not m._forward_hooks and not m._backward_hooks
    (l_hooks, w_hooks), (l_ghost, w_ghost) = models
    assert l_ghost == pytest.approx(l_hooks, rel=1e-6)
    for a, b in zip(w_hooks, w_ghost):
        assert torch.allclose(a, b, atol=1e-6)


def test_ghost_clipping_equals_hooks_on_the_authors_cnn():
    """The ALI-DPFL diagnosis runs fedavg-cnn (conv + max-pool + 512-wide FC) in ghost mode for speed."""
    torch.manual_seed(0)
    x, y = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))
    init = build_model("fedavg-cnn", (1, 28, 28), 10).state_dict()
    weights = []
    for mode in ("hooks", "ghost"):
        model = build_model("fedavg-cnn", (1, 28, 28), 10)
        model.load_state_dict(init)
        with DpSgd(model, dataset_size=40, sample_rate=0.3, max_grad_norm=0.5, noise_multiplier=1.0, lr=0.5,
                   grad_sample_mode=mode, noise_generator=torch.Generator().manual_seed(2)) as trainer:
            trainer.step(x, y)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert not torch.equal(weights[0], torch.cat([v.flatten() for v in init.values()]))
    assert torch.allclose(weights[0], weights[1], atol=1e-5)


def test_config_offers_every_grad_sample_mode():
    from common.config import SCHEMA
    assert SCHEMA["dp-grad-sample-mode"].choices == GRAD_SAMPLE_MODES


def test_ghost_clipping_refuses_a_custom_loss():
    with pytest.raises(ValueError, match="ghost"):
        DpSgd(nn.Linear(3, 2), dataset_size=10, sample_rate=0.5, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1,
              grad_sample_mode="ghost", loss_fn=lambda out, y: out.sum())


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
class _UnusedHead(nn.Module):
    """A trainable parameter the forward pass never reaches (an unused head)."""

    def __init__(self):
        super().__init__()
        self.body, self.spare = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew", "ghost"])
def test_a_parameter_the_forward_pass_does_not_reach_has_zero_gradient(mode):
    """Opacus stopped at the first non-empty batch ("Per sample gradient is not initialized"; ghost: no
    _norm_sample), after the round's charge. Its per-sample gradient is zero: the used layer moves exactly as
    it does in a model without the unused one, and the unused one does not move without noise."""
    x, y = _data()
    torch.manual_seed(0)
    model = _UnusedHead()
    alone = nn.Sequential(nn.Linear(6, 3))
    alone.load_state_dict({f"0.{k}": v for k, v in model.body.state_dict().items()})
    spare = [p.detach().clone() for p in model.spare.parameters()]
    for m in (model, alone):
        dpsgd_train(m, x, y, steps=3, sample_rate=0.5, max_grad_norm=0.5, noise_multiplier=0.0, lr=1.0, seed=1,
                    grad_sample_mode=mode)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model.body.parameters(), alone.parameters()))
    assert all(torch.equal(p, s) for p, s in zip(model.spare.parameters(), spare))
