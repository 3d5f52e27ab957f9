"""What a train instruction will spend, as ledger entries.

One function for both sides: the client checks and records these entries
before it releases anything; the server records the same entries in its
mirror for every instruction a client did not refuse (an upper bound on what
clients spent), so the epsilon it reports comes from the same events.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

from common.number_checks import is_real
from common.privacy.events import (ALI_PAPER_MU_ASSUMPTION, FEDLAP_LABELS_ASSUMPTION, LedgerEntry, dpsgd_steps,
                                   objective_perturbation_release, output_perturbation_release)


class BeyondBudget(ValueError):
    """An ALI-DPFL instruction asks for more steps than this side's budget allows (R_c): a node whose data
    owner caps its epsilon below the run's has a smaller R_c than the server plans with."""


def local_steps(config: Mapping[str, Any], instruction: Mapping[str, Any]) -> int:
    """Steps a DP-SGD instruction asks for: the instruction's `local-steps` beats the run config's, but
    never exceeds it (a server asking for 10**12 steps would hang the node or exhaust its memory in the
    accountant). ALI-DPFL's server sets tau every round, never above the budget's R_c steps."""
    steps = int(instruction.get("local-steps", config["local-steps"]))
    ali = config["strategy"] == "ali-dpfl"
    cap = ali_iteration_budget(config) if ali else int(config["local-steps"])
    if ali and steps > cap:
        raise BeyondBudget(f"the instruction asks for local-steps = {steps}, more than the R_c = {cap} DP-SGD "
                           f"steps this budget allows")
    if not 1 <= steps <= cap:
        raise ValueError(f"the instruction asks for local-steps = {steps}; this run allows 1..{cap}")
    return steps


def ali_iteration_budget(config: Mapping[str, Any]) -> int:
    """R_c: the DP-SGD steps the run's budget allows (ALI-DPFL's Alg. 3, by the run's accountant)."""
    return _iteration_budget(float(config["target-epsilon"]), float(config["target-delta"]),
                             float(config["dp-sample-rate"]), float(config["dp-noise-multiplier"]),
                             str(config["accountant"]))


@functools.lru_cache(maxsize=16)
def _iteration_budget(target: float, delta: float, q: float, sigma: float, accountant: str) -> int:
    from common.privacy.ali import iteration_budget

    return iteration_budget(target, delta, q, sigma, accountant)


def local_epochs(config: Mapping[str, Any], instruction: Mapping[str, Any]) -> int:
    """Epochs an instruction asks for: a straggler's fewer, never more than the run config's."""
    epochs = int(instruction.get("local-epochs", config["local-epochs"]))
    if not 1 <= epochs <= int(config["local-epochs"]):
        raise ValueError(f"the instruction asks for local-epochs = {epochs}; this run allows "
                         f"1..{config['local-epochs']}")
    return epochs


def fedlap_accesses(config: Mapping[str, Any]) -> int:
    """FedLAP-DP's real-gradient accesses per round, worst case (the while loop never stops early):
    max-outer (5) x R_i x N sampled Gaussian mechanisms. Synthesis, model steps on S_k and server
    training are post-processing and add nothing."""
    return (int(config["fedlap-max-outer"]) * int(config["fedlap-restarts"])
            * int(config["fedlap-real-batches"]))


def planned_entries(config: Mapping[str, Any], instruction: Mapping[str, Any],
                    dataset_size: int | None = None) -> list[LedgerEntry]:
    """Ledger entries for carrying out `instruction` under the run's privacy mechanism.

    `dataset_size` |D_i| (the client's own training-set size; the server passes
    the size the client enrolled with) is needed by the Upcycled-FL mechanisms,
    whose sensitivity and epsilon depend on it."""
    if config["strategy"] == "dpfedavg-hu":  # Hu et al.'s own mechanism (privacy must be "none")
        from common.privacy.hu import hu_entries

        return hu_entries(config, instruction, _required_size(config, instruction, dataset_size))
    if config["privacy"] == "none":
        return []
    if config["privacy"] in ("output", "objective"):
        return upcycled_private_entries(config, instruction, dataset_size)
    if config["privacy"] == "dpsgd" and config["strategy"] == "fedlap":
        # S_k's labels are ipc copies of every class in the client's data (client/updates/fedlap.py
        # initial_set): released as they are, covered only under the paper's public-label-set assumption.
        return [_assuming(dpsgd_steps(float(config["dp-sample-rate"]), float(config["dp-noise-multiplier"]),
                                      fedlap_accesses(config), round=int(instruction["server-round"]),
                                      mechanism="fedlap-dp"), FEDLAP_LABELS_ASSUMPTION)]
    if config["privacy"] == "dpsgd":
        entry = dpsgd_steps(float(config["dp-sample-rate"]), float(config["dp-noise-multiplier"]),
                            local_steps(config, instruction), round=int(instruction["server-round"]))
        if config["strategy"] == "ali-dpfl" and config["ali-mu-estimator"] == "paper":
            entry = _assuming(entry, ALI_PAPER_MU_ASSUMPTION)  # client/updates/ali_paper.py: a noise-free norm
        return [entry]
    raise ValueError(f"no privacy plan for mechanism {config['privacy']!r}")


def delta_too_large(config: Mapping[str, Any], dataset_size: int) -> bool:
    """At delta >= 1/|D_i| a mechanism that publishes one record of D_i outright is (0, delta)-DP: no epsilon at
    that delta guarantees anything (objective perturbation's pure epsilon is stated at delta 0)."""
    return config["privacy"] != "objective" and float(config["target-delta"]) * int(dataset_size) >= 1


def objective_condition_problem(config: Mapping[str, Any], sizes) -> str | None:
    """Why Upcycled-FL Thm 6.3 (objective perturbation's epsilon) does not hold for the smallest client:
    it needs u2 <= 0.5 |D_i| mu, i.e. prox-mu >= 2 u2 / |D_i|. None if it holds, or the run has no
    objective perturbation."""
    from common.privacy.accounting import thm63_holds

    smallest = min(sizes, default=0)
    u2, mu = float(config["objective-u2"]), float(config["prox-mu"])
    if config["privacy"] != "objective" or thm63_holds(u2, mu, smallest):
        return None
    return (f"objective perturbation's epsilon (Upcycled-FL Thm 6.3) needs objective-u2 <= 0.5 |D_i| prox-mu for "
            f"every client; the smallest holds {smallest} examples, so objective-u2 = {u2:g} needs prox-mu >= "
            f"{2 * u2 / max(smallest, 1):.4g} (got {mu:g}): raise prox-mu, or lower objective-u2 if the loss allows")


def _assuming(entry: LedgerEntry, assumption: str) -> LedgerEntry:
    """`entry` with an unenforced condition of its bound (events.py: reports print it as NOT A GUARANTEE)."""
    return LedgerEntry(entry.kind, {**entry.params, "assumption": assumption}, entry.round, entry.meta)


# Upcycled-FL private variants ----------------------------------------------------
# One entry per train instruction, i.e. per odd round of an Upcycled run (even
# rounds send no instruction, so they add nothing to a client's ledger) and per
# round of a vanilla run. The entry's `round` is the server round, and
# meta["train-round"] the training-round index m (vanilla m = Upcycled 2m-1).

def prox_mu(config: Mapping[str, Any], instruction: Mapping[str, Any]) -> float:
    """The mu of the local objective's proximal term (Thm 6.3): the instruction's, else the run's prox-mu.
    Under objective perturbation mu enters the epsilon charged, so only the run's own mu is accepted."""
    mu = instruction.get("proximal-mu", config["prox-mu"])
    if not is_real(mu) or not 0 <= mu < math.inf:
        raise ValueError(f"the instruction's proximal-mu must be a finite number >= 0, got {mu!r}")
    mu = float(mu)
    if config["privacy"] == "objective" and mu != float(config["prox-mu"]):
        raise ValueError(f"the instruction asks for proximal-mu = {mu:g}; objective perturbation is accounted "
                         f"with this run's prox-mu = {config['prox-mu']:g}")
    return mu


def _required_size(config: Mapping[str, Any], instruction: Mapping[str, Any], dataset_size: int | None) -> int:
    if dataset_size is None:
        dataset_size = instruction.get("dataset-size")
    if dataset_size is None or int(dataset_size) <= 0:
        raise ValueError(f"the privacy plan of this run needs the client's dataset size |D_i| > 0; got "
                         f"{dataset_size!r}")
    return int(dataset_size)


def is_private(config: Mapping[str, Any]) -> bool:
    """Whether the run's clients spend privacy (and the server reports epsilon). Hu et al.'s
    non-private baseline (hu-sigma = 0 and no budget to calibrate a sigma from) releases updates
    without noise: it is not private, so it reports no epsilon rather than epsilon 0."""
    if config["strategy"] == "dpfedavg-hu":
        return float(config["hu-sigma"]) > 0 or float(config["target-epsilon"]) > 0
    return config["privacy"] != "none"


def upcycled_private_entries(config: Mapping[str, Any], instruction: Mapping[str, Any],
                             dataset_size: int | None) -> list[LedgerEntry]:
    dataset_size = _required_size(config, instruction, dataset_size)
    server_round = int(instruction["server-round"])
    train_round = int(instruction.get("train-round", server_round))
    if config["privacy"] == "output":
        rule = str(config["output-sensitivity"])
        return [output_perturbation_release(
            float(config["output-clip"]), float(config["output-noise-std"]), int(dataset_size), rule=rule,
            round=server_round, perturb=str(config["output-perturb"]), **{"train-round": train_round},
            sensitivity_rule="paper: tau/|D_i| (Thm 6.2)" if rule == "paper" else "ball: 2 tau")]
    return [objective_perturbation_release(
        float(config["objective-alpha"]), float(config["objective-u1"]), float(config["objective-u2"]),
        prox_mu(config, instruction), int(dataset_size), round=server_round, **{"train-round": train_round})]
