"""pFedMe (Dinh et al. 2020) as the Upcycled-FL code runs it; not in Flower.

The server is FedAvg's p-weighted average of the clients' local models (the
code's beta is unused, i.e. beta = 1). The personalised models stay on the
clients (`Context.state`, client/updates/pfedme.py); each trained client
reports its personalised model's accuracy on its own test split.

The paper's pFedMe numbers are the test-size-weighted accuracy of all
clients' personalised models. The server cannot ask idle clients (that would
be a message), so it keeps each client's latest report and adds to the
round's train metrics `personal-accuracy` (weighted by test examples over
every client that has trained so far) and `personal-clients` (how many).
The weights are the test-split sizes the server loads with the federation,
not the ones clients report: one client claiming 2^31 test examples took
the average over.
Clients never sampled yet are missing from it, unlike in the authors' code,
which evaluates all personalised models (untrained ones = the initial model).
The runner's central accuracy remains the global model's.

Upcycled-FL: even rounds extrapolate the global model only; personalised
models are not updated (no client is contacted), as in the authors' code,
and the even round's row repeats their accuracy (`personal_metrics`).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from server.roster import Roster
from server.strategies.fedavg import RosterSampling


class PFedMe(RosterSampling, FlowerFedAvg):
    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *,
                 test_sizes: Mapping[int, int]):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of))
        self.setup_sampling(roster, seed, fraction_train, log)
        self.test_sizes = dict(test_sizes)  # partition -> its test split's size
        self.personal: dict[int, float] = {}  # partition -> latest personal accuracy

    def load_state_dict(self, state: dict) -> None:
        personal = state.get("personal")
        if isinstance(personal, dict):  # a checkpoint from before session 12: partition -> (accuracy, test examples)
            state = {**state, "personal": {p: v[0] if isinstance(v, (tuple, list)) else v for p, v in personal.items()}}
        super().load_state_dict(state)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        # read before screening: it drops from every reply a metric that one reply lacks
        reported = {msg.metadata.src_node_id: next(iter(msg.content.metric_records.values()), {}).get(
            "personal-accuracy") for msg in replies if msg.has_content()}
        good = self.screened(replies)
        arrays, metrics = super().aggregate_train(server_round, good)
        for msg in good:
            acc, partition = reported.get(msg.metadata.src_node_id), self._partition_of[msg.metadata.src_node_id]
            if isinstance(acc, (int, float)) and 0 <= acc <= 1 and self.test_sizes.get(partition, 0) > 0:
                self.personal[partition] = float(acc)
        if metrics is not None:
            metrics.update(self.personal_metrics())
        return arrays, metrics

    def personal_metrics(self) -> dict[str, float]:
        """The personalised models' accuracy, weighted by test examples over every client trained so far
        (the Upcycled wrapper reports it on even rounds too, where no personalised model changes)."""
        if not self.personal:
            return {}
        total = sum(self.test_sizes[p] for p in self.personal)
        return {"personal-accuracy": sum(a * self.test_sizes[p] for p, a in self.personal.items()) / total,
                "personal-clients": len(self.personal)}
