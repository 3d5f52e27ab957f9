"""Plain local SGD: the FedAvg local update rule.

Speed notes (a Table-1 style run is ~58k tiny steps, so per-step overhead is
what costs, not arithmetic):

- The SGD step is written out instead of using `torch.optim.SGD`. It performs
  exactly the operations of `torch.optim.SGD(lr, momentum)` (no weight decay,
  no dampening, no Nesterov), as `torch._foreach_*` calls (one dispatch per
  operation for all tensors; on CPU they run the same per-tensor kernels as
  the optimizer's default path, so the numbers are bit-identical:
  tests/test_inprocess_sgd.py), but it skips the optimizer's per-step
  bookkeeping (profiler ranges, param-group walks, `zero_grad`) that cost more
  than the step itself for a 210-weight model, and the first-use import of
  `torch._dynamo` that `Optimizer.__init__` triggers (~2 s once per process).
- Gradients come from `batch_gradient` (client/updates/batch_gradient.py:
  logistic regression's kernels called directly, bit-identical to autograd;
  `torch.autograd.grad` for other models), so nothing accumulates in `.grad`
  and there is nothing to zero.
- Each epoch gathers its shuffled rows once (`x[order]`) and slices batches
  from that: the same batches, one indexing op per epoch instead of per step.
- Batch losses stay on the device and are read once at the end (one sync
  instead of one `.item()` per step; matters on GPUs).
"""

from __future__ import annotations

import torch

from client.updates.batch_gradient import batch_gradient


def minibatches(n: int, batch_size: int, generator: torch.Generator):
    """Indices of one shuffled epoch in batches (the last one may be short)."""
    order = torch.randperm(n, generator=generator)
    return order.split(batch_size)


def train_sgd(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
              lr: float, momentum: float, generator: torch.Generator) -> float:
    """Run `epochs` epochs of minibatch SGD (fresh momentum buffer) and return the mean batch loss."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # The step writes through `.data` views: the same storage, outside autograd, so no
    # no_grad context needs entering and leaving on each of the ~60k steps of a run.
    weights = [p.data for p in params]
    buffers: list[torch.Tensor] | None = None  # momentum buffers, created from the first gradients
    gradient = batch_gradient(model, params, y)
    losses: list[torch.Tensor] = []
    n = len(y)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)  # the same draw as `minibatches`
        for xb, yb in zip(x[order].split(batch_size), y[order].split(batch_size)):
            loss, grads = gradient(xb, yb)
            buffers = sgd_step(weights, grads, buffers, lr, momentum)
            losses.append(loss)
    if not losses:
        return 0.0
    return sum(torch.stack(losses).tolist()) / len(losses)  # the same float sum as per-step .item()


def sgd_step(weights, grads, buffers, lr, momentum):
    """One step of torch.optim.SGD(lr, momentum) on `weights` (tensors outside autograd); returns the momentum
    buffers (created from the first gradients). A None gradient is skipped, as torch.optim does."""
    if any(g is None for g in grads) or (buffers is not None and any(b is None for b in buffers)):
        return _sgd_step_per_tensor(weights, grads, buffers, lr, momentum)
    if momentum == 0.0:
        torch._foreach_add_(weights, grads, alpha=-lr)
        return buffers
    if buffers is None:
        buffers = [torch.clone(g).detach() for g in grads]  # torch.optim.SGD's first step
    else:
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, grads)
    torch._foreach_add_(weights, buffers, alpha=-lr)
    return buffers


def _sgd_step_per_tensor(weights, grads, buffers, lr, momentum):
    if momentum != 0.0 and buffers is None:
        buffers = [None] * len(weights)
    for i, (w, g) in enumerate(zip(weights, grads)):
        if g is None:
            continue
        if momentum != 0.0:
            if buffers[i] is None:
                buffers[i] = torch.clone(g).detach()
            else:
                buffers[i].mul_(momentum).add_(g)
            g = buffers[i]
        w.add_(g, alpha=-lr)
    return buffers


def sgd_update(client, content, state):
    """FedAvg's client: local SGD from the received model; reply with the model."""
    from flwr.app import MetricRecord, RecordDict

    from common.privacy.plan import local_epochs
    from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays
    from common.seeding import torch_generator

    config, instruction = client.config, content[CONFIG]
    load_arrays(client.model, content[ARRAYS])
    server_round = int(instruction.get("train-round", instruction["server-round"]))  # keys minibatch order
    loss = train_sgd(
        client.model, client.x, client.y,
        epochs=local_epochs(config, instruction),
        batch_size=int(config["batch-size"]), lr=float(config["lr"]), momentum=float(config["momentum"]),
        generator=torch_generator(int(config["seed"]), "client-train", client.partition, server_round),
    )
    metrics = MetricRecord({NUM_EXAMPLES: client.num_train, "train-loss": loss})
    return RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics})
