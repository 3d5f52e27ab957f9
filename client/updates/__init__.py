"""Local update rules, one module each, looked up by the run's `strategy`.

A rule takes the node's `LocalClient`, the instruction's content and the
node's persistent `Context.state`, and returns the reply content.
"""

from __future__ import annotations

import importlib
from typing import Callable

from flwr.app import RecordDict

UpdateRule = Callable[["LocalClient", RecordDict, RecordDict], RecordDict]  # noqa: F821


# strategy -> (module, function). FedAvgM and FedYogi differ from FedAvg on the
# server only; Upcycled-FL wraps the server strategy and keeps the base's rule.
RULES = {
    "fedavg": ("client.updates.sgd", "sgd_update"),
    "fedavgm": ("client.updates.sgd", "sgd_update"),
    "fedyogi": ("client.updates.sgd", "sgd_update"),
    "fedprox": ("client.updates.prox", "prox_update"),
    "scaffold": ("client.updates.scaffold", "scaffold_update"),
    "feddyn": ("client.updates.feddyn", "feddyn_update"),
    "pfedme": ("client.updates.pfedme", "pfedme_update"),
    "dpfedavg-hu": ("client.updates.hu_dpsgd", "hu_update"),
    "fedlap": ("client.updates.fedlap", "fedlap_update"),
    "ali-dpfl": ("client.updates.ali_paper", "ali_update"),  # DP-SGD (+ the paper's mu leak if asked)
}

# Rules that apply the run's privacy mechanism themselves (FedLAP-DP: DP-SGD gradients as matching targets).
OWN_PRIVACY = {"fedlap", "ali-dpfl"}


# The privacy mechanism replaces the base rule where it changes local training.
PRIVATE_RULES = {
    "dpsgd": ("client.updates.dpsgd", "dpsgd_update"),
}


# Upcycled-FL private variants: wrappers around the base rule (client/updates/perturbation.py).
PRIVATE_WRAPPERS = {
    "output": ("client.updates.perturbation", "output_perturbed"),
    "objective": ("client.updates.perturbation", "objective_perturbed"),
}


def update_rule(strategy: str, privacy: str = "none") -> UpdateRule:
    if privacy in PRIVATE_WRAPPERS:
        module, name = PRIVATE_WRAPPERS[privacy]
        return getattr(importlib.import_module(module), name)(update_rule(strategy, "none"))
    if privacy in PRIVATE_RULES and strategy not in OWN_PRIVACY:
        module, name = PRIVATE_RULES[privacy]
        return getattr(importlib.import_module(module), name)
    if strategy not in RULES:
        raise ValueError(f"no local update rule for strategy {strategy!r}")
    module, name = RULES[strategy]
    return getattr(importlib.import_module(module), name)
