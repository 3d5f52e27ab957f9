"""Upcycled-FL's private variants (Yin et al., TMLR 2024, Sec. 6) as wrappers
around any base rule. They run only when a client gets a train instruction:
on an Upcycled-FL run that is the odd rounds (even rounds contact no client),
so a client's ledger holds entries for odd rounds only.

Output perturbation (`privacy = "output"`):
    w_hat = xi(w) + n,  xi(w) = w / max(1, ||w||_2 / tau),  n ~ N(0, sigma^2 I)
applied to the model in the base rule's reply (`output-perturb = "model"`, the
paper), or to the update w - w_global (`"update"`: the server then receives
w_global + xi(w - w_global) + n). tau = `output-clip`, sigma =
`output-noise-std` (the std: the authors' code used sigma^2 as the std). The
noise is drawn from a generator seeded by `common.seeding.mechanism_seed`
(secret by default; `dp-noise-seed = "run-seed"`: keyed on the run seed,
partition and training round, reproducible). Ledger: one Gaussian release per
instruction, sensitivity tau/|D_i| (`output-sensitivity = "paper"`, Thm 6.2)
or 2 tau (`"ball"`).

Objective perturbation (`privacy = "objective"`):
    w_hat = argmin F_i(w) + mu/2 ||w - w_global||^2 + <n, w>,  p(n) ~ exp(-alpha ||n||_2)
one n per client per instruction, in the model's own dimension
(`common.privacy.mechanisms.objective_noise_like`), added to the gradient of
every local step through the `linear_term` hook of the shared local loop
(client/updates/corrected.py); the base rule is otherwise unchanged. alpha =
`objective-alpha`. Ledger: one pure-DP release per instruction, Thm 6.3 with
the constants `objective-u1`, `objective-u2` and the proximal mu (FedProx only,
see common/config.py).

Both charge the client's ledger before anything leaves it (a crash can only
over-count): objective perturbation before training, output perturbation after
its local training, once the trained model is finite, before the noise (a
training that diverges is refused with nothing charged). Both go through
`common.privacy.plan.planned_entries`, the same function the server's mirror uses. The reply's data-dependent metrics (the base
rule's train-loss, `clip-norm-before`) never leave the client: the ClientApp
keeps only data-independent metrics in a private run (client/app.py). Any
other record in the base rule's reply (another ArrayRecord, a ConfigRecord)
is refused (`update_rule` hands every wrapper its base through
`refuse_unprotected`): neither mechanism protects it, so nothing is released.
"""

from __future__ import annotations

import math

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from client.privacy import charge
from client.updates.corrected import linear_term
from common.privacy.mechanisms import l2_norm, objective_noise_like, output_perturbation
from common.privacy.plan import planned_entries
from common.records import ARRAYS, CONFIG, METRICS, arrays_to_state_dict
from common.seeding import mechanism_seed, torch_generator


def _train_round(instruction) -> int:
    return int(instruction.get("train-round", instruction["server-round"]))


def _with_metrics(reply: RecordDict, client, extra: dict) -> RecordDict:
    metrics = dict(reply[METRICS]) if METRICS in reply else {}
    delta = float(client.config["target-delta"])
    metrics["epsilon"] = client.ledger.epsilon(delta, accountant=str(client.config["accountant"]))
    metrics.update(extra)
    reply[METRICS] = MetricRecord(metrics)
    return reply


def output_perturbed(base):
    """The base rule, its reply's model clipped to tau and noised (or its update: `output-perturb`)."""

    def rule(client, content: RecordDict, state: RecordDict) -> RecordDict:
        config, instruction = client.config, content[CONFIG]
        received = arrays_to_state_dict(content[ARRAYS]) if config["output-perturb"] == "update" else None
        reply = base(client, content, state)  # nothing leaves before the noise: the charge can wait for it
        trained = arrays_to_state_dict(reply[ARRAYS])
        before = l2_norm(trained if received is None else
                         {k: v - received[k] for k, v in trained.items() if v.is_floating_point()})
        if not math.isfinite(before):  # refused before the charge: nothing is released
            raise ValueError(f"local training diverged (the {'update' if received is not None else 'model'} "
                             "is not finite); nothing was released or charged")
        charge(client.ledger, config, planned_entries(config, instruction, dataset_size=client.num_train),
               server_run=client.run_id)
        generator = torch_generator(mechanism_seed(config), "client-output-noise", client.partition,
                                    _train_round(instruction))
        noisy = output_perturbation(trained, clip_norm=float(config["output-clip"]),
                                    noise_std=float(config["output-noise-std"]), reference=received,
                                    generator=generator)
        reply[ARRAYS] = ArrayRecord(noisy)
        return _with_metrics(reply, client, {"clip-norm-before": before,
                                             "clipped": float(before > float(config["output-clip"]))})

    rule.__name__ = f"output_perturbed_{getattr(base, '__name__', 'rule')}"
    return rule


def objective_perturbed(base):
    """The base rule with the linear term <n, w> in its local objective (n drawn once per instruction)."""

    def rule(client, content: RecordDict, state: RecordDict) -> RecordDict:
        config, instruction = client.config, content[CONFIG]
        charge(client.ledger, config, planned_entries(config, instruction, dataset_size=client.num_train),
               server_run=client.run_id)
        generator = torch_generator(mechanism_seed(config), "client-objective-noise", client.partition,
                                    _train_round(instruction))
        params = {name: p.detach() for name, p in client.model.named_parameters() if p.requires_grad}
        noise = objective_noise_like(params, float(config["objective-alpha"]), generator)
        token = linear_term.set(noise)
        try:
            reply = base(client, content, state)
        finally:
            linear_term.reset(token)
        # on the CPU: an MPS device has no float64
        norm = float(torch.sqrt(sum((n.detach().cpu().double() ** 2).sum() for n in noise.values())))
        return _with_metrics(reply, client, {"objective-noise-norm": norm})

    rule.__name__ = f"objective_perturbed_{getattr(base, '__name__', 'rule')}"
    return rule
