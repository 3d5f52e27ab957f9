"""SCAFFOLD's local update (Karimireddy et al. 2020), control variates option II.

The node keeps its control variate c_i in `Context.state` (zero before its
first round), so it persists across rounds and never leaves the node; only
the change delta c_i goes up. Each step uses the gradient g + c - c_i; after K
steps from x to y:

    c_i+ = c_i - c + (x - y) / (K lr)        delta c_i = c_i+ - c_i

c_i+ becomes c_i once the server says it aggregated this reply
(client/updates/acknowledged.py). K counts the optimizer steps actually taken
(a straggler takes fewer). Control variates exist for every array of the model
record; only parameters get a correction, the others (buffers) keep c_i = 0.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from client.updates.acknowledged import keep, settled
from client.updates.corrected import local_plan, parameters_copy, train_corrected
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, arrays_to_state_dict, load_arrays, model_to_arrays

CONTROL = "control"  # the global control variate c, sent with the model
CONTROL_DELTA = "control-delta"  # delta c_i, in the reply
STATE_KEY = "scaffold-control"  # c_i, in the node's Context.state


def scaffold_update(client, content, state):
    config, instruction = client.config, content[CONFIG]
    load_arrays(client.model, content[ARRAYS])
    c = arrays_to_state_dict(content[CONTROL])
    stored = settled(state, STATE_KEY, instruction)
    if stored is not None:
        c_i = arrays_to_state_dict(stored)
    else:
        c_i = OrderedDict((k, torch.zeros_like(v)) for k, v in c.items())
    if c.keys() != c_i.keys() or any(c[k].shape != c_i[k].shape for k in c):
        raise ValueError("the global control variate does not match this node's control variate")
    x = parameters_copy(client.model)
    device = next(iter(x.values())).device
    correction_of = {name: (c[name] - c_i[name]).to(device) for name in x}

    def control(params, grads):
        for name, g in grads.items():
            g.add_(correction_of[name])

    lr = float(config["lr"])
    epochs, generator = local_plan(client, instruction)
    loss, steps = train_corrected(client.model, client.x, client.y, epochs=epochs,
                                  batch_size=int(config["batch-size"]), lr=lr, momentum=float(config["momentum"]),
                                  generator=generator, correction=control)
    y = dict(client.model.named_parameters())
    c_plus = OrderedDict()
    for key in c:
        if key in x and steps > 0:
            c_plus[key] = c_i[key] - c[key] + (x[key] - y[key].detach()).cpu() / (steps * lr)
        else:
            c_plus[key] = c_i[key].clone()
    delta = OrderedDict((k, c_plus[k] - c_i[k]) for k in c)
    keep(state, STATE_KEY, ArrayRecord(c_plus), instruction)
    metrics = MetricRecord({NUM_EXAMPLES: client.num_train, "train-loss": loss})
    return RecordDict({ARRAYS: model_to_arrays(client.model), CONTROL_DELTA: ArrayRecord(delta), METRICS: metrics})
