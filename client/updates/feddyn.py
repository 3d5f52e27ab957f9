"""FedDyn's local update (Acar et al. 2021, Algorithm 1).

The node keeps g_i, its running estimate of grad L_i at its last local model,
in `Context.state` (zero before its first round). It minimises

    L_i(w) - <g_i, w> + alpha/2 ||w - w_global||^2

by SGD with gradient-norm clipping (`feddyn-max-grad-norm`, 10 as the
Upcycled-FL code), then updates g_i <- g_i - alpha (w_i - w_global), kept
once the server says it aggregated this reply (client/updates/acknowledged.py).

The Upcycled-FL code (adapted from FL-bench) differs: its client loss is
CE + alpha <w, -w_global + nabla_i> (no alpha/2 ||w||^2 part), and its server
keeps nabla_i per sampled *position*, updated by w_i - mean(w) so that
mean(nabla) never moves from 0: the server is then an unweighted FedAvg. We
implement the published algorithm; see server/strategies/feddyn.py.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from client.updates.acknowledged import keep, settled
from client.updates.corrected import local_plan, parameters_copy, train_corrected
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, arrays_to_state_dict, load_arrays, model_to_arrays

STATE_KEY = "feddyn-grad"  # g_i, in the node's Context.state


def feddyn_update(client, content, state):
    config, instruction = client.config, content[CONFIG]
    load_arrays(client.model, content[ARRAYS])
    alpha = float(config["feddyn-alpha"])
    anchor = parameters_copy(client.model)
    stored = settled(state, STATE_KEY, instruction)
    if stored is not None:
        g_i = arrays_to_state_dict(stored)
    else:
        g_i = OrderedDict((k, torch.zeros_like(v).cpu()) for k, v in anchor.items())
    if g_i.keys() != anchor.keys():
        raise ValueError("the stored FedDyn state does not match the model")
    device = next(iter(anchor.values())).device
    g_dev = {k: v.to(device) for k, v in g_i.items()}

    def dynamic(params, grads):
        for name, g in grads.items():
            g.sub_(g_dev[name]).add_(params[name] - anchor[name], alpha=alpha)

    epochs, generator = local_plan(client, instruction)
    loss, _ = train_corrected(client.model, client.x, client.y, epochs=epochs, batch_size=int(config["batch-size"]),
                              lr=float(config["lr"]), momentum=float(config["momentum"]), generator=generator,
                              correction=dynamic, max_grad_norm=float(config["feddyn-max-grad-norm"]))
    w = dict(client.model.named_parameters())
    keep(state, STATE_KEY, ArrayRecord(OrderedDict(
        (k, g_i[k] - alpha * (w[k].detach() - anchor[k]).cpu()) for k in g_i)), instruction)
    metrics = MetricRecord({NUM_EXAMPLES: client.num_train, "train-loss": loss})
    return RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics})
