"""DP-SGD local training (DP-FedAvg, DP-FedProx: record-level DP on every client).

The run's `local-steps` (or the instruction's, e.g. ALI-DPFL's tau*) DP-SGD
steps through Opacus: Poisson sampling at `dp-sample-rate`, clipping to
`dp-clip`, noise multiplier `dp-noise-multiplier`. The ledger is charged
before training, so a crash can only over-count, never under-count.

DP-FedProx (strategy `fedprox`): the proximal term mu/2 ||w - w_global||^2
depends on no record, so its gradient mu (w - w_global) is added after the
noise (post-processing, `DpSgd`'s regularizer): the privacy cost is DP-SGD's.
"""

from __future__ import annotations

import torch
from flwr.app import MetricRecord, RecordDict

from client.privacy import charge
from common.privacy.dpsgd import dpsgd_train
from common.privacy.plan import local_steps, planned_entries, prox_mu
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays
from common.seeding import mechanism_seed, numpy_rng


def dpsgd_update(client, content: RecordDict, state: RecordDict) -> RecordDict:
    config, instruction = client.config, content[CONFIG]
    train_round = int(instruction.get("train-round", instruction["server-round"]))  # keys the noise and sampling
    # raises BudgetExhausted (or StaleInstruction: a later start of the run has taken over)
    charge(client.ledger, config, planned_entries(config, instruction), server_run=client.run_id)
    load_arrays(client.model, content[ARRAYS])
    root = mechanism_seed(config)  # secret by default: the server must not regenerate noise or batches
    seed = int(numpy_rng(root, "client-dpsgd", client.partition, train_round).integers(2**62))
    result = dpsgd_train(
        client.model, client.x, client.y, steps=local_steps(config, instruction),
        sample_rate=float(config["dp-sample-rate"]), max_grad_norm=float(config["dp-clip"]),
        noise_multiplier=float(config["dp-noise-multiplier"]), lr=float(config["lr"]),
        momentum=float(config["momentum"]), seed=seed, grad_sample_mode=str(config["dp-grad-sample-mode"]),
        regularizer=proximal_term(client, config, instruction),
    )
    delta = float(config["target-delta"])
    metrics = MetricRecord({
        NUM_EXAMPLES: client.num_train, "train-loss": result.mean_loss, "dp-steps": result.steps,
        "epsilon": client.ledger.epsilon(delta, accountant=str(config["accountant"])),
    })
    return RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics})


def proximal_term(client, config, instruction):
    """FedProx's mu/2 ||w - w_global||^2 on the received model (None for other strategies or mu = 0)."""
    mu = prox_mu(config, instruction) if config["strategy"] == "fedprox" else 0.0
    if mu == 0:
        return None
    anchor = [p.detach().clone() for p in client.model.parameters()]

    def term(model: torch.nn.Module) -> torch.Tensor:
        return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
    return term
