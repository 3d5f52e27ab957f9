"""FedLAP pure math: matching distance, DSA augmentation, trust-region pieces."""

import math

import pytest
import torch

from common.fedlap.augment import OPS, augment
from common.fedlap.matching import matching_distance, rowwise_cosine_distance
from common.fedlap.trust import calibrate_radius, cosine_lr, param_distance, vote_radius


def test_cosine_distance_is_mean_over_rows_and_scale_invariant():
    a = torch.randn(4, 3, 3, 3)
    assert float(rowwise_cosine_distance(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(rowwise_cosine_distance(a, 7.0 * a)) == pytest.approx(0.0, abs=1e-6)
    assert float(rowwise_cosine_distance(a, -a)) == pytest.approx(2.0, abs=1e-6)  # mean over 4 rows, not 8
    b = a.clone()
    b[0] = -b[0]  # one row of four flipped: mean distance 2/4
    assert float(rowwise_cosine_distance(a, b)) == pytest.approx(0.5, abs=1e-6)


def test_bias_is_one_row():
    v = torch.tensor([1.0, 0.0])
    assert float(rowwise_cosine_distance(v, torch.tensor([0.0, 1.0]))) == pytest.approx(1.0, abs=1e-6)


def test_matching_distance_adds_weighted_squared_l2():
    real = [torch.ones(2, 3), torch.ones(3)]
    syn = [2 * torch.ones(2, 3), 2 * torch.ones(3)]
    # cosine parts are 0; squared L2 = 6 + 3
    assert float(matching_distance(real, syn, 0.1)) == pytest.approx(0.9, abs=1e-5)
    assert float(matching_distance(real, syn, 0.0)) == pytest.approx(0.0, abs=1e-5)


def test_matching_distance_differentiable_in_synthetic_only():
    real = [torch.randn(3, 4, requires_grad=True)]
    syn = [torch.randn(3, 4, requires_grad=True)]
    matching_distance(real, syn).backward()
    assert syn[0].grad is not None and real[0].grad is None


@pytest.mark.parametrize("op", OPS)
def test_augment_same_seed_same_transform_and_differentiable(op):
    x = torch.randn(3, 1, 12, 12, requires_grad=True)
    out1, out2 = augment(x, 5, ops=(op,)), augment(x, 5, ops=(op,))
    assert out1.shape == x.shape and torch.equal(out1, out2)
    # batch mode: the transform does not depend on the batch size (real vs synthetic batches)
    assert torch.allclose(augment(x[:1], 5, ops=(op,)), out1[:1], atol=1e-5)
    out1.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_param_distance_and_cosine_lr():
    a = [torch.zeros(2), torch.zeros(1)]
    b = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]
    assert param_distance(a, b) == pytest.approx(5.0)
    assert cosine_lr(0.1, 1, 10) == pytest.approx(0.1)
    assert cosine_lr(0.1, 10, 10) == pytest.approx(1e-6)
    assert cosine_lr(0.1, 5, 9) == pytest.approx(0.05)


def test_vote_radius():
    assert vote_radius([3.0, 1.0, 2.0], "min") == 1.0
    assert vote_radius([3.0, 1.0, 2.0], "max") == 3.0
    assert vote_radius([3.0, 1.0, 2.0, 4.0], "median") == 2.5
    assert vote_radius([3.0], "fixed") is None
    with pytest.raises(ValueError):
        vote_radius([1.0], "mean")


def test_calibrate_radius_takes_distance_at_loss_minimum_and_clips():
    state = {"t": 0}
    losses = [5.0, 3.0, 1.0, 2.0, 4.0]

    def step():
        state["t"] += 1

    def loss():
        return losses[state["t"] - 1]

    assert calibrate_radius(step, lambda: float(state["t"]), loss, 5, cap=10.0) == 3.0
    state["t"] = 0
    assert calibrate_radius(step, lambda: float(state["t"]), loss, 5, cap=2.5) == 2.5
    assert math.isfinite(calibrate_radius(step, lambda: 1.0, lambda: 1.0, 0, cap=2.0))
