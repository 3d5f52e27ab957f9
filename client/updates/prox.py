"""FedProx's local update: SGD on F_i(w) + mu/2 ||w - w_global||^2.

mu arrives in the instruction as `proximal-mu` (Flower's FedProx convention);
the run config's `prox-mu` is the fallback.
"""

from __future__ import annotations

from flwr.app import MetricRecord, RecordDict

from client.updates.corrected import local_plan, parameters_copy, train_corrected
from common.privacy.plan import prox_mu
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays


def prox_update(client, content, state):
    config, instruction = client.config, content[CONFIG]
    load_arrays(client.model, content[ARRAYS])
    mu = prox_mu(config, instruction)
    anchor = parameters_copy(client.model)

    def proximal(params, grads):
        for name, g in grads.items():
            g.add_(params[name] - anchor[name], alpha=mu)

    epochs, generator = local_plan(client, instruction)
    loss, _ = train_corrected(client.model, client.x, client.y, epochs=epochs, batch_size=int(config["batch-size"]),
                              lr=float(config["lr"]), momentum=float(config["momentum"]), generator=generator,
                              correction=proximal if mu > 0 else None)
    metrics = MetricRecord({NUM_EXAMPLES: client.num_train, "train-loss": loss})
    return RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics})
