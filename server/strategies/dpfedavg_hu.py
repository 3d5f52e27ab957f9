"""DP-FedAvg with zCDP of Hu, Guo & Gong (2021), the server: FedAvg over r of n
devices per round, sigma calibrated from a target epsilon.

* Sampling: r = max(floor(fraction-train * n), 1) devices per round, uniformly
  without replacement, from (seed, round) (`server/sampling.py`), as
  Algorithm 1. The whole schedule is drawn in advance (the paper fixes it),
  so the participation count C_i of every device is known before round 1.
* Aggregation: the paper's (1/r) sum_i theta_i, a plain mean of the returned
  models (not FedAvg's examples-weighted one, which the /r credit would not
  cover: with unequal m_i a large device's update is hidden by less than r
  devices' noise). Under secure aggregation (`secure-aggregation = true`) the
  grid sums the models unweighted too (`server/secagg_grid.py` UNIT_RECORDS)
  and hands the strategy their mean.
* sigma: `hu-sigma` when `target-epsilon` = 0; otherwise calibrated so that every
  device ends at most at (target-epsilon, target-delta) after its C_i participations
  under `hu-accountant` (common/privacy/hu.py has the formulas):
  sigma = max_i sqrt(C_i K_i / rho*), K_i the per-participation coefficient
  of device i (its m_i), rho* = (sqrt(log 1/delta + eps) - sqrt(log 1/delta))^2.
  The `paper` accountant's secure-aggregation credit r is taken only when
  secure aggregation is on (without it, the paper's "approach without secure
  aggregation": r = 1), and only for min(r, secagg-min-survivors) clients: a
  round may decode the sum of that many (the rest dropped). The DP-DSGD baseline is this strategy with
  hu-local-steps = 1 and hu-accountant = 'paper-dsgd'.
* Every instruction carries hu-sigma, hu-local-steps, hu-clip and
  hu-accountant; clients check their own ledger against target-epsilon.
* Epsilon per round is reported by the runner's privacy mirror like every
  other mechanism's (`common/privacy/plan.py` -> `common/privacy/hu.py`:
  one zCDP entry per instruction sent and not refused).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord

from common.config import ConfigError, RunConfig
from common.privacy.accounting import zcdp_epsilon
from common.privacy.hu import calibrate_sigma, epochs_touched, paper_assumption, round_rho
from server.roster import Roster
from common.config import clients_per_round
from server.sampling import sample_partitions
from server.strategies.fedavg import FedAvg


def participation_schedule(seed: int, rounds: int, partitions: list[int], fraction: float) -> dict[int, int]:
    """C_i: how many of rounds 1..T sample each partition."""
    counts = {p: 0 for p in partitions}
    for t in range(1, rounds + 1):
        for p in sample_partitions(seed, t, partitions, fraction):
            counts[p] += 1
    return counts


class DpFedAvgHu(FedAvg):
    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *, config: RunConfig):
        super().__init__(roster, seed, fraction_train, log)
        self.tau = int(config["hu-local-steps"])
        self.clip = float(config["hu-clip"])
        self.accountant = str(config["hu-accountant"])
        self.delta = float(config["target-delta"])
        self.gamma = int(config["batch-size"])
        self.num_clients = len(roster.node_of)
        self.secure = bool(config["secure-aggregation"])
        self.r = clients_per_round(self.num_clients, fraction_train)
        # The /r credit counts the clients whose noise is in the decoded sum: at least secagg-min-survivors
        # (the grid aborts a round with fewer), not necessarily all r selected.
        self.credited = min(self.r, int(config["secagg-min-survivors"])) if self.secure else 1
        # Upcycled-FL trains on odd rounds only, and draws clients by training round: (T + 1) // 2 of them
        rounds = int(config["num-rounds"])
        rounds = (rounds + 1) // 2 if config["upcycled"] else rounds
        self.schedule = participation_schedule(seed, rounds, roster.partitions, fraction_train)
        for p in roster.partitions:  # gamma > m stops the run here, not in every client after its charge
            epochs_touched(self.tau, roster.num_examples[p], self.gamma)
        epsilon = float(config["target-epsilon"])
        if epsilon > 0:
            self.sigma = max(
                calibrate_sigma(self.accountant, epsilon, self.delta, max(c, 1), **self._coefficients(p))
                for p, c in self.schedule.items())
        else:
            self.sigma = float(config["hu-sigma"])
        planned = self.planned_epsilon()
        log(f"DP-FedAvg (Hu et al.): r = {self.r} of n = {self.num_clients}, tau = {self.tau}, G = {self.clip:g}, "
            f"gamma = {self.gamma}, sigma = {self.sigma:.6g} ({self.accountant} accountant"
            f"{', secure-aggregation credit' if self.secure and self.accountant == 'paper' else ''}); "
            f"participations C_i in {min(self.schedule.values())}..{max(self.schedule.values())}; "
            f"planned epsilon {planned:.4f} at delta {self.delta:g}")
        assumptions = {paper_assumption(self.accountant, roster.num_examples[p], self.gamma, self.tau, self.credited)
                       for p in roster.partitions} - {None}
        for text in sorted(assumptions):
            log(f"DP-FedAvg (Hu et al.): this epsilon is NOT A GUARANTEE: it assumes {text}")

    def sample(self, train_round: int) -> list[int]:
        """The draw `schedule` counted, over all partitions, less the retired ones: sigma is calibrated on each
        client's C_i, so a retired client must not shift the others' draws (past their C_i: past the target)."""
        return [p for p in sample_partitions(self.seed, train_round, list(self.roster.partitions), self.fraction)
                if p not in self.retired]

    def setup_stragglers(self, fraction: float, local_epochs: int) -> None:
        """Refused: a straggler runs fewer local epochs, but this rule runs tau steps (the client's own)."""
        if fraction > 0:
            raise ConfigError("strategy 'dpfedavg-hu' runs hu-local-steps steps per round, which stragglers do not "
                              f"shorten (clients refuse another tau); set stragglers = 0 (got {fraction})")
        super().setup_stragglers(fraction, local_epochs)

    def _coefficients(self, partition: int) -> dict:
        return {"local_steps": self.tau, "clip": self.clip, "dataset_size": self.roster.num_examples[partition],
                "batch_size": self.gamma, "clients_per_round": self.credited,
                "num_clients": self.num_clients}

    def round_rho(self, partition: int) -> float:
        return round_rho(self.accountant, self.sigma, **self._coefficients(partition)) if self.sigma > 0 else math.inf

    def planned_epsilon(self) -> float:
        """The largest epsilon any device reaches over the whole drawn schedule (inf without noise)."""
        if self.sigma <= 0:
            return math.inf
        return max(zcdp_epsilon(c * self.round_rho(p), self.delta) for p, c in self.schedule.items())

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The plain mean of the screened replies' models (module docstring: Aggregation)."""
        good = self.screened(replies)
        if not good:
            return None, None
        metrics = self.train_metrics_aggr_fn([m.content for m in good], self.weighted_by_key)
        models = [m.content[self.arrayrecord_key] for m in good]
        return ArrayRecord({key: Array(np.mean([np.asarray(m[key].numpy(), np.float64) for m in models], axis=0)
                                       .astype(array.numpy().dtype)) for key, array in models[0].items()}), metrics

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        out = super().round_config(server_round, config)
        out["hu-sigma"] = float(self.sigma)
        out["hu-local-steps"] = self.tau
        out["hu-clip"] = self.clip
        out["hu-accountant"] = self.accountant
        out["hu-clients-per-round"] = self.credited  # r of the paper's /r credit
        return out
