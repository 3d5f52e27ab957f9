"""Plain local SGD: the FedAvg local update rule."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def minibatches(n: int, batch_size: int, generator: torch.Generator):
    """Indices of one shuffled epoch in batches (the last one may be short)."""
    order = torch.randperm(n, generator=generator)
    return order.split(batch_size)


def train_sgd(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
              lr: float, momentum: float, generator: torch.Generator) -> float:
    """Run `epochs` epochs of minibatch SGD (fresh momentum buffer) and return the mean batch loss."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    total, batches = 0.0, 0
    for _ in range(epochs):
        for idx in minibatches(len(y), batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
    return total / max(batches, 1)
