"""ALI-DPFL's client: DP-SGD for exactly the broadcast tau (`local-steps` of
the instruction), ledger charged per step before training (client/updates/dpsgd.py).

With `ali-mu-estimator = 'paper'` the client also reports
||grad F_i(w^i) - grad F_i(w)||, the difference of its TRUE full-batch local
gradients at the round's start model w and at its result w^i, which the
paper's mu estimate needs. That number is computed on the raw data without
clipping or noise: it is released outside the DP accounting (a leak the
ledger does not show), so the client logs a warning every time it does it.
With the default `dp-secant` estimator this rule is exactly `dpsgd_update`.
"""

from __future__ import annotations

import logging

import torch
from flwr.app import RecordDict

from client.updates.dpsgd import dpsgd_update
from common.records import ARRAYS, METRICS, load_arrays
from common.privacy.ali import GRAD_DIFF_METRIC, PAPER_WARNING

log = logging.getLogger("privfed.ali")


def full_gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """grad of the mean cross-entropy over all of (x, y), flattened (no clipping, no noise), in eval mode: F_i's
    gradient has no dropout masks (the mode DP-SGD or an evaluation left the model in is restored)."""
    training = model.training
    model.eval()
    try:
        return _mean_gradient(model, x, y, chunk)
    finally:
        model.train(training)


def _mean_gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    n = len(x)
    for start in range(0, n, chunk):
        xb, yb = x[start:start + chunk], y[start:start + chunk]
        loss = torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum") / n
        for acc, g in zip(total, torch.autograd.grad(loss, params)):
            acc.add_(g)
    return torch.cat([g.reshape(-1) for g in total])


def ali_update(client, content: RecordDict, state: RecordDict) -> RecordDict:
    if str(client.config["ali-mu-estimator"]) != "paper":
        return dpsgd_update(client, content, state)
    log.warning(PAPER_WARNING)
    load_arrays(client.model, content[ARRAYS])
    before = full_gradient(client.model, client.x, client.y)  # released only if the budget allows the round
    reply = dpsgd_update(client, content, state)  # charges the ledger (or refuses), then tau DP-SGD steps
    after = full_gradient(client.model, client.x, client.y)
    reply[METRICS][GRAD_DIFF_METRIC] = float(torch.linalg.vector_norm(after - before))
    return reply
