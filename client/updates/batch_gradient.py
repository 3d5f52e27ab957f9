"""The minibatch cross-entropy and its gradient, as the local SGD loops need it.

`batch_gradient(model, params, y)` returns a function (xb, yb) -> (loss,
grads) for minibatches of (x, y), grads in `params` order (None for a
parameter the loss does not use, as `torch.autograd.grad(..., allow_unused=True)`).

For logistic regression (`logreg`, and `logreg-softmax`, its double-softmax
variant: common/models.py) and class-index labels it calls the forward and backward kernels itself:
the same ATen kernels, with the same arguments and in the same order, that
autograd runs for `F.cross_entropy(model(xb), yb)`, so loss and gradients are
bit-identical (tests/test_batch_gradient.py). Why by hand: a 610-weight model
costs nothing to compute, and autograd's per-call graph building and engine
dispatch were over half of each step; a Table-1 suite is ~13 million such
steps (`python benchmarks/local_step.py` measures both side by side). Every
other model goes through autograd.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

aten = torch.ops.aten
MEAN = 1  # ATen's reduction enum: what F.cross_entropy's default reduction="mean" passes
IGNORE_INDEX = -100  # F.cross_entropy's default

BatchGradient = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]]


def batch_gradient(model: nn.Module, params: list[torch.Tensor], y: torch.Tensor) -> BatchGradient:
    def autograd_gradient(xb, yb):
        loss = F.cross_entropy(model(xb), yb)
        return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)

    linear, softmax = _logistic_regression(model)
    if (linear is not None and y.dtype == torch.long  # (class probabilities as labels: autograd)
            and [id(p) for p in params] == [id(linear.weight), id(linear.bias)]
            and all(p.requires_grad for p in params)  # autograd refuses a frozen one: let it say so
            and linear.weight.is_contiguous()  # the layout whose addmm backward _logreg_gradient follows
            and not _hooked(model)):
        return functools.partial(_logreg_gradient, linear.weight.detach(), linear.bias.detach(), softmax,
                                 autograd_gradient)
    return autograd_gradient


def _logistic_regression(model: nn.Module) -> tuple[nn.Linear | None, bool]:
    """(the Linear layer, whether a softmax follows it) for Sequential(Flatten(), Linear[, Softmax(dim=1)]), in
    exactly the forms common/models.py builds; (None, False) for anything else."""
    layers = list(model.children()) if type(model) is nn.Sequential else []
    if len(layers) not in (2, 3) or type(layers[0]) is not nn.Flatten or type(layers[1]) is not nn.Linear:
        return None, False
    flatten, linear = layers[0], layers[1]
    softmax = len(layers) == 3
    if (flatten.start_dim, flatten.end_dim) != (1, -1) or linear.bias is None:
        return None, False
    if softmax and (type(layers[2]) is not nn.Softmax or layers[2].dim != 1):
        return None, False
    return linear, softmax


def _hooked(model: nn.Module) -> bool:
    """Whether anything would run besides the layers' own forward: module hooks (the model's, its layers',
    global ones), tensor hooks on the parameters, or a forward replaced on the instance."""
    from torch.nn.modules import module as torch_module

    hook_dicts = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    modules = list(model.modules())
    return (any(getattr(m, name, None) for m in modules for name in hook_dicts)
            or any(getattr(torch_module, f"_global{name}", None) for name in hook_dicts)
            or any(p._backward_hooks for p in model.parameters())
            or any("forward" in vars(m) for m in modules))


def _logreg_gradient(weight, bias, softmax, autograd_gradient, xb, yb):
    """F.cross_entropy(model(xb), yb) and its gradient for model = Linear[+ Softmax], kernel by kernel as
    autograd runs them (addmm, [_softmax], _log_softmax, nll_loss; then their backward kernels in reverse).
    Under autocast, whose casts only the module calls get, autograd computes it."""
    if torch.is_autocast_enabled(xb.device.type):
        return autograd_gradient(xb, yb)
    xb = xb.flatten(1)
    z = torch.addmm(bias, xb, weight.t())
    p = torch._softmax(z, 1, False) if softmax else z
    log_p = torch._log_softmax(p, 1, False)
    loss, total_weight = aten.nll_loss_forward(log_p, yb, None, MEAN, IGNORE_INDEX)
    g = aten.nll_loss_backward(_one(loss.device, loss.dtype), log_p, yb, None, MEAN, IGNORE_INDEX, total_weight)
    g = aten._log_softmax_backward_data(g, log_p, 1, p.dtype)
    if softmax:
        g = aten._softmax_backward_data(g, p, 1, z.dtype)
    # addmm's backward for mat2 = weight.t() (column-major) is grad.t().mm(mat1).t(); the .t() of the
    # weight's own transpose cancels it: weight's gradient is g.t().mm(xb). The bias's is g summed to its shape.
    return loss, (g.t().mm(xb), g.sum(0))


@functools.cache
def _one(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The scalar 1 autograd seeds a backward pass with (read only, so one per device and dtype)."""
    return torch.ones((), device=device, dtype=dtype)
