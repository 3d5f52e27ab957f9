"""DP-SGD local training (FedAvg with record-level DP on every client).

The run's `local-steps` (or the instruction's, e.g. ALI-DPFL's tau*) DP-SGD
steps through Opacus: Poisson sampling at `dp-sample-rate`, clipping to
`dp-clip`, noise multiplier `dp-noise-multiplier`. The ledger is charged
before training, so a crash can only over-count, never under-count.
"""

from __future__ import annotations

from flwr.app import MetricRecord, RecordDict

from client.privacy import charge
from common.privacy.dpsgd import dpsgd_train
from common.privacy.plan import local_steps, planned_entries
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays
from common.seeding import numpy_rng


def dpsgd_update(client, content: RecordDict, state: RecordDict) -> RecordDict:
    config, instruction = client.config, content[CONFIG]
    train_round = int(instruction.get("train-round", instruction["server-round"]))  # keys the noise and sampling
    charge(client.ledger, config, planned_entries(config, instruction))  # raises BudgetExhausted
    load_arrays(client.model, content[ARRAYS])
    seed = int(numpy_rng(int(config["seed"]), "client-dpsgd", client.partition, train_round).integers(2**62))
    result = dpsgd_train(
        client.model, client.x, client.y, steps=local_steps(config, instruction),
        sample_rate=float(config["dp-sample-rate"]), max_grad_norm=float(config["dp-clip"]),
        noise_multiplier=float(config["dp-noise-multiplier"]), lr=float(config["lr"]),
        momentum=float(config["momentum"]), seed=seed,
    )
    delta = float(config["target-delta"])
    metrics = MetricRecord({
        NUM_EXAMPLES: client.num_train, "train-loss": result.mean_loss, "dp-steps": result.steps,
        "epsilon": client.ledger.epsilon(delta, accountant=str(config["accountant"])),
    })
    return RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics})
