"""FedProx (Li et al. 2020) on Flower's `FedProx`: the server is FedAvg
(p-weighted average) and sends mu as `proximal-mu` in every instruction; the
proximal term lives in the client rule (client/updates/prox.py).

Flower's `FedProx.configure_train` is where it adds `proximal-mu`; our
`RosterSampling.configure_train` replaces it, so the key is added in
`round_config` instead. Same message, same server."""

from __future__ import annotations

from typing import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedProx as FlowerFedProx

from server.roster import Roster
from server.strategies.fedavg import RosterSampling


class FedProx(RosterSampling, FlowerFedProx):
    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *, proximal_mu: float = 0.5):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of), proximal_mu=proximal_mu)
        self.setup_sampling(roster, seed, fraction_train, log)

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        out = super().round_config(server_round, config)
        out["proximal-mu"] = float(self.proximal_mu)
        return out

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return super().aggregate_train(server_round, self.screened(replies))
