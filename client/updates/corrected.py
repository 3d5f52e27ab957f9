"""Local minibatch SGD with a per-step gradient correction: the loop that the
FedProx, SCAFFOLD and FedDyn rules share. Each rule adds its own term to the
minibatch gradient before the optimizer step:

    FedProx    g += mu (w - w_global)                (gradient of mu/2 ||w - w_global||^2)
    SCAFFOLD   g += c - c_i                          (control variates)
    FedDyn     g += -g_i + alpha (w - w_global)      (dynamic regulariser), then clip ||g||

The step is SGD with the run's momentum, buffers fresh every round (as in the
Upcycled-FL code). Adding the term to the gradient before a
momentum step is exactly what the authors' `FedProxOptimizer` does with its
in-place add into the momentum buffer (buf' = beta buf' + g + mu (w - w0)).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Callable

import torch

from client.updates.batch_gradient import batch_gradient
from client.updates.sgd import sgd_step
from common.privacy.plan import local_epochs
from common.seeding import torch_generator

Correction = Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], None]

# Objective perturbation (client/updates/perturbation.py): name -> n while a perturbed rule runs. Every
# step adds n to the gradient, i.e. the local objective gains the linear term <n, w>.
linear_term: ContextVar[dict[str, torch.Tensor] | None] = ContextVar("linear_term", default=None)


def clip_by_total_norm(grads: list[torch.Tensor], max_norm: float) -> None:
    """Scale `grads` in place so their joint L2 norm is at most `max_norm` (as clip_grad_norm_)."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    grads_scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(grads_scale)


def train_corrected(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                    lr: float, momentum: float, generator: torch.Generator, correction: Correction | None = None,
                    max_grad_norm: float = 0.0) -> tuple[float, int]:
    """Run `epochs` epochs; return (mean minibatch cross-entropy, number of optimizer steps).

    `correction(params, grads)` adds its term to `grads` (name -> tensor) in place.
    The step is written out as in client/updates/sgd.py (the operations of
    `torch.optim.SGD(lr, momentum)`, fresh buffers each round), for speed.
    """
    model.train()
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    named = dict(model.named_parameters())
    params = [named[name] for name in names]
    weights = [p.data for p in params]  # the step writes outside autograd, as in client/updates/sgd.py
    buffers: list[torch.Tensor | None] | None = None
    losses: list[torch.Tensor] = []
    linear = linear_term.get()
    gradient = batch_gradient(model, params, y)
    n = len(y)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)  # the same draw as `minibatches`
        for xb, yb in zip(x[order].split(batch_size), y[order].split(batch_size)):
            loss, raw = gradient(xb, yb)
            with torch.no_grad():
                grads = {name: (torch.zeros_like(p) if g is None else g) for name, p, g in zip(names, params, raw)}
                if correction is not None:
                    correction(named, grads)
                if linear is not None:
                    for name, g in grads.items():
                        g.add_(linear[name])
                if max_grad_norm > 0:
                    clip_by_total_norm(list(grads.values()), max_grad_norm)
                buffers = sgd_step(weights, [grads[name] for name in names], buffers, lr, momentum)
            losses.append(loss)
    if not losses:
        return 0.0, 0
    return sum(torch.stack(losses).tolist()) / len(losses), len(losses)


def local_plan(client, instruction) -> tuple[int, torch.Generator]:
    """(local epochs, minibatch generator) for this instruction: stragglers get fewer epochs, and
    the minibatch order is keyed on the training round (so vanilla round m = Upcycled round 2m-1)."""
    epochs = local_epochs(client.config, instruction)
    train_round = int(instruction.get("train-round", instruction["server-round"]))
    generator = torch_generator(int(client.config["seed"]), "client-train", client.partition, train_round)
    return epochs, generator


def parameters_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}
