"""zCDP accounting of DP-FedAvg (Hu, Guo & Gong 2021): pure functions.

See client/updates/hu_dpsgd.py for the mechanism and the three accountants
(`conservative` default, `paper` = Theorem 1 with the /r secure-aggregation
credit, `paper-dsgd` = the DP-DSGD baseline's formula). Both the client (its
ledger) and the server (its mirror, through `common.privacy.plan`) use these.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from common.privacy.events import LedgerEntry, zcdp_release

ACCOUNTANTS = ("conservative", "paper", "paper-dsgd")


# --- accounting (pure) ---------------------------------------------------------------
def epochs_touched(local_steps: int, dataset_size: int, batch_size: int) -> int:
    """E = ceil(tau / floor(m / gamma)): local epochs a round of tau steps draws batches from."""
    per_epoch = dataset_size // batch_size
    if per_epoch < 1:
        raise ValueError(f"batch size gamma = {batch_size} exceeds the local dataset (m = {dataset_size})")
    return -(-local_steps // per_epoch)


def rho_coefficient(accountant: str, *, local_steps: int, clip: float, dataset_size: int, batch_size: int,
                    clients_per_round: int = 1, num_clients: int = 1) -> float:
    """K with rho = K / sigma^2 for one participation (module docstring); `clients_per_round` is r for
    the paper's secure-aggregation credit (pass 1 without secure aggregation)."""
    tau, G, m, gamma = int(local_steps), float(clip), int(dataset_size), int(batch_size)
    if accountant == "conservative":
        return epochs_touched(tau, m, gamma) * 2.0 * G * G / (gamma * gamma)
    if accountant == "paper":
        return 2.0 * tau * G * G / (max(int(clients_per_round), 1) * m * gamma)
    if accountant == "paper-dsgd":
        return 2.0 * G * G / (max(int(num_clients), 1) * gamma * gamma)
    raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(ACCOUNTANTS)}")


def round_rho(accountant: str, sigma: float, **kw) -> float:
    """rho of one participation at noise std sigma (> 0)."""
    if not sigma > 0:
        raise ValueError(f"sigma must be positive for a finite rho, got {sigma}")
    return rho_coefficient(accountant, **kw) / (sigma * sigma)


def calibrate_sigma(accountant: str, epsilon: float, delta: float, participations: int, **kw) -> float:
    """The smallest sigma with participations * rho(sigma) <= rho*(epsilon, delta) (closed form).

    rho* = (sqrt(log 1/delta + epsilon) - sqrt(log 1/delta))^2 inverts Lemma 4 exactly;
    sigma = sqrt(C K / rho*), raised by a relative 1e-10 so that rounding never puts epsilon past the target.
    """
    from common.privacy.accounting import zcdp_rho_for_epsilon

    if not epsilon > 0:
        raise ValueError(f"target epsilon must be positive, got {epsilon}")
    target = zcdp_rho_for_epsilon(float(epsilon), float(delta))
    if not target > 0:  # eps^2 underflows (epsilon below ~1e-154)
        raise ValueError(f"target epsilon {epsilon:g} is too small to calibrate a noise for (rho* underflows to 0)")
    sigma = math.sqrt(int(participations) * rho_coefficient(accountant, **kw) / target) * (1 + 1e-10)
    if not math.isfinite(sigma):
        raise ValueError(f"target epsilon {epsilon:g} needs an infinite noise sigma: raise target-epsilon")
    return sigma


SECAGG_CREDIT = ("Hu et al.'s secure-aggregation credit rho / r (heuristic: it counts the noise of the r = "
                 "min(selected, secagg-min-survivors) clients surely in the unweighted decoded sum as hiding each "
                 "one's update, so it needs that none colludes with the server and each adds its noise honestly; "
                 "a curious selected client knows its own)")


def paper_assumption(accountant: str, dataset_size: int, batch_size: int, local_steps: int,
                     clients_per_round: int = 1) -> str | None:
    """What the 'paper' accountants' rho assumes and this run does not meet or enforce (None: nothing; see
    events.py): Thm 1 needs whole epochs, m/gamma dividing tau (else one step alone costs more than its
    rho), and its /r credit for secure aggregation is heuristic; the DP-DSGD formula is applied as printed
    (its /n credit is not derived)."""
    m, gamma, tau = int(dataset_size), int(batch_size), int(local_steps)
    if accountant == "paper-dsgd":
        return "the DP-DSGD baseline's epsilon formula as Hu et al. print it (its 1/n credit is not derived)"
    if accountant != "paper":
        return None
    unmet = [f"Hu et al. Thm 1's condition that m/gamma divides tau (m = {m}, gamma = {gamma}, tau = {tau}: not "
             "met, and one step alone costs more than the rho charged)"] if m % gamma or tau % (m // gamma) else []
    return "; ".join(unmet + ([SECAGG_CREDIT] if clients_per_round > 1 else [])) or None


def hu_entries(config: Mapping[str, Any], instruction: Mapping[str, Any], dataset_size: int) -> list[LedgerEntry]:
    """One rho-zCDP entry for one participation (none without noise: the non-private baseline)."""
    sigma = float(instruction["hu-sigma"])
    if sigma <= 0:
        return []
    # tau, G and the accountant are the run config's (the client refuses an instruction that differs).
    tau, clip = int(config["hu-local-steps"]), float(config["hu-clip"])
    accountant, gamma = str(config["hu-accountant"]), int(config["batch-size"])
    r = int(instruction.get("hu-clients-per-round", 1))
    rho = round_rho(accountant, sigma, local_steps=tau, clip=clip, dataset_size=int(dataset_size), batch_size=gamma,
                    clients_per_round=r, num_clients=int(config["num-clients"]))
    server_round = int(instruction["server-round"])  # the ledger's round, as every mechanism's (Upcycled: odd)
    train_round = int(instruction.get("train-round", server_round))
    entry = zcdp_release(rho, round=server_round, mechanism="hu-dp-fedavg", accountant=accountant, sigma=sigma,
                         local_steps=tau, clip=clip, batch_size=gamma, dataset_size=int(dataset_size),
                         clients_per_round=r, **{"train-round": train_round})
    assumption = paper_assumption(accountant, int(dataset_size), gamma, tau, r)
    if assumption:
        entry = LedgerEntry(entry.kind, {**entry.params, "assumption": assumption}, entry.round, entry.meta)
    return [entry]
