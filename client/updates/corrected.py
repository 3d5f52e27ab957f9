"""Local minibatch SGD with a per-step gradient correction: the loop that the
FedProx, SCAFFOLD and FedDyn rules share. Each rule adds its own term to the
minibatch gradient before the optimizer step:

    FedProx    g += mu (w - w_global)                (gradient of mu/2 ||w - w_global||^2)
    SCAFFOLD   g += c - c_i                          (control variates)
    FedDyn     g += -g_i + alpha (w - w_global)      (dynamic regulariser), then clip ||g||

The optimizer is `torch.optim.SGD` with the run's momentum, re-created every
round (as in the Upcycled-FL code). Adding the term to the gradient before a
momentum step is exactly what the authors' `FedProxOptimizer` does with its
in-place add into the momentum buffer (buf' = beta buf' + g + mu (w - w0)).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from client.updates.sgd import minibatches
from common.seeding import torch_generator

Correction = Callable[[dict[str, torch.nn.Parameter]], None]


def train_corrected(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                    lr: float, momentum: float, generator: torch.Generator, correction: Correction | None = None,
                    max_grad_norm: float = 0.0) -> tuple[float, int]:
    """Run `epochs` epochs; return (mean minibatch cross-entropy, number of optimizer steps)."""
    model.train()
    named = dict(model.named_parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    total, steps = 0.0, 0
    for _ in range(epochs):
        for idx in minibatches(len(y), batch_size, generator):
            optimizer.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            if correction is not None:
                with torch.no_grad():
                    for p in named.values():
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                    correction(named)
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
            optimizer.step()
            total += loss.item()
            steps += 1
    return total / max(steps, 1), steps


def local_plan(client, instruction) -> tuple[int, torch.Generator]:
    """(local epochs, minibatch generator) for this instruction: stragglers get fewer epochs, and
    the minibatch order is keyed on the training round (so vanilla round m = Upcycled round 2m-1)."""
    epochs = int(instruction.get("local-epochs", client.config["local-epochs"]))
    train_round = int(instruction.get("train-round", instruction["server-round"]))
    generator = torch_generator(int(client.config["seed"]), "client-train", client.partition, train_round)
    return epochs, generator


def parameters_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}
