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


def sgd_update(client, content, state):
    """FedAvg's client: local SGD from the received model; reply with the model."""
    from flwr.app import MetricRecord, RecordDict

    from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays
    from common.seeding import torch_generator

    config, instruction = client.config, content[CONFIG]
    load_arrays(client.model, content[ARRAYS])
    server_round = int(instruction.get("train-round", instruction["server-round"]))  # keys minibatch order
    loss = train_sgd(
        client.model, client.x, client.y,
        epochs=int(instruction.get("local-epochs", config["local-epochs"])),
        batch_size=int(config["batch-size"]), lr=float(config["lr"]), momentum=float(config["momentum"]),
        generator=torch_generator(int(config["seed"]), "client-train", client.partition, server_round),
    )
    metrics = MetricRecord({NUM_EXAMPLES: client.num_train, "train-loss": loss})
    return RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics})
