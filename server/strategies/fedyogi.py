"""FedYogi (Reddi et al. 2021) on Flower's `FedYogi`.

Flower's update is the one the Upcycled-FL code uses: Delta = sum_i p_i w_i - x
(the p-weighted client deltas), m = b1 m + (1 - b1) Delta,
v = v - (1 - b2) Delta^2 sign(v - Delta^2) from v0 = 0, no bias correction,
x <- x + eta m / (sqrt(v) + tau). Defaults as the authors' code: eta 0.1,
tau 1e-3, b1 0.9, b2 0.99 (Flower's own defaults are eta 0.01; its `eta_l`
is unused by the server).

Flower's `FedOpt.configure_train` stores the model the deltas are taken from;
our `RosterSampling.configure_train` replaces it, so we store it here, from
the `arrays` handed in every round (Upcycled's even rounds move the model
without the strategy). m_t and v_t are only touched by `aggregate_train`, so
even rounds leave them as they are.
"""

from __future__ import annotations

from typing import Iterable

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

from server.roster import Roster
from server.strategies.fedavg import RosterSampling


class FedYogi(RosterSampling, FlowerFedYogi):
    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *, eta: float = 0.1,
                 tau: float = 1e-3, beta_1: float = 0.9, beta_2: float = 0.99):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of), eta=eta, beta_1=beta_1, beta_2=beta_2, tau=tau)
        self.setup_sampling(roster, seed, fraction_train, log)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return super().aggregate_train(server_round, self.screened(replies))
