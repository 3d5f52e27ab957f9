"""pFedMe's local update (Dinh et al. 2020), as the Upcycled-FL code runs it.

The personalised model theta and the local model w both start from the
received global model. For every minibatch, K (`pfedme-k`) steps

    theta <- theta - lr (grad f(theta; batch) + lambda (theta - w) + mu theta)

then w <- w - lambda lr (w - theta). The reply carries w (the server averages
it, beta = 1). theta is kept in the node's `Context.state` and evaluated on
the node's own test split; that personalised accuracy is what the paper
reports for pFedMe, and it travels in the reply's metrics. Plain steps, no
momentum (as the authors' pFedMe optimizer); `lr` is the run's lr.
"""

from __future__ import annotations

import torch
from flwr.app import MetricRecord, RecordDict

from client.updates.batch_gradient import batch_gradient
from client.updates.corrected import local_plan, parameters_copy
from common.evaluation import evaluate
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays

STATE_KEY = "pfedme-personal"  # theta, in the node's Context.state


def personal_step(thetas, grads, ws, lr, lam, mu) -> None:
    """theta <- theta - lr (g + lambda (theta - w) + mu theta), in place, as three fused multi-tensor ops
    (this step runs K times per minibatch, so its per-step overhead is what a pFedMe run costs)."""
    torch._foreach_mul_(thetas, 1.0 - lr * (lam + mu))
    torch._foreach_add_(thetas, ws, alpha=lr * lam)
    present = [(t, g) for t, g in zip(thetas, grads) if g is not None]
    if present:
        torch._foreach_add_([t for t, _ in present], [g for _, g in present], alpha=-lr)


def pfedme_update(client, content, state):
    config, instruction = client.config, content[CONFIG]
    model = client.model
    load_arrays(model, content[ARRAYS])
    lr, lam, mu, k = (float(config["lr"]), float(config["pfedme-lambda"]), float(config["pfedme-mu"]),
                      int(config["pfedme-k"]))
    w_local = parameters_copy(model)
    named = dict(model.named_parameters())
    names = [name for name in w_local if named[name].requires_grad]
    params = [named[name] for name in names]
    thetas = [p.data for p in params]  # written through .data views: outside autograd, no no_grad per step
    ws = [w_local[name] for name in names]
    gradient = batch_gradient(model, params, client.y)
    epochs, generator = local_plan(client, instruction)
    batch_size = int(config["batch-size"])
    model.train()
    losses: list[torch.Tensor] = []
    n = len(client.y)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)  # the same draw as `minibatches`
        for xb, yb in zip(client.x[order].split(batch_size), client.y[order].split(batch_size)):
            for _ in range(k):
                loss, grads = gradient(xb, yb)
                personal_step(thetas, grads, ws, lr, lam, mu)
                losses.append(loss)
            torch._foreach_lerp_(ws, thetas, lam * lr)  # w <- w - lambda lr (w - theta)
    train_loss = sum(torch.stack(losses).tolist()) / len(losses) if losses else 0.0

    personal = model_to_arrays(model)
    state[STATE_KEY] = personal
    n_test = len(client.y_test)
    p_loss, p_acc = evaluate(model, client.x_test, client.y_test, client.device) if n_test else (0.0, 0.0)
    with torch.no_grad():
        for name, p in zip(names, params):
            p.copy_(w_local[name])
    metrics = MetricRecord({NUM_EXAMPLES: client.num_train, "train-loss": train_loss,
                            "personal-accuracy": float(p_acc), "personal-loss": float(p_loss)})
    return RecordDict({ARRAYS: model_to_arrays(model), METRICS: metrics})
