"""FedDyn (Acar et al. 2021, Algorithm 1); not in Flower.

The server keeps h (zero at start) and, with P the clients that replied and
N all clients:

    h <- h - alpha (1/N) sum_{i in P} (w_i - x)
    x <- (1/|P|) sum_{i in P} w_i - h / alpha

(unweighted, as the paper and the Upcycled-FL code). The client side keeps
its own gradient state (client/updates/feddyn.py). The aggregate needs only
sum_i w_i and |P|, so it works under secure aggregation with weight 1 per
client.

Deliberate difference from the Upcycled-FL code: that code (adapted from
FL-bench) updates nabla[position in the sampled list] += w_i - mean(w), so
the mean of nabla stays 0 and its server is an unweighted FedAvg; its client
loss has the linear term alpha <w, nabla_i - x> but no alpha/2 ||w||^2 part.
We run the published algorithm with the authors' alpha = 0.01 and clipping
at 10.

Upcycled-FL: even rounds extrapolate the model only; h is left as it is (the
authors' line that "upcycles" nabla rebinds a local variable and does
nothing, so this matches what their code runs).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from server.roster import Roster
from server.strategies.fedavg import RosterSampling


class FedDyn(RosterSampling, FlowerFedAvg):
    acknowledges = True  # g_i moves with the replies aggregated (client/updates/acknowledged.py)

    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *, alpha: float = 0.01):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of))
        self.setup_sampling(roster, seed, fraction_train, log)
        self.alpha = alpha
        self.num_clients = len(roster.node_of)
        self.h: dict[str, np.ndarray] | None = None

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good = self.screened(replies)
        if not good:
            return None, None
        contents = [m.content for m in good]
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        start = {k: a.numpy() for k, a in self._sent.items()}
        if self.h is None:
            self.h = {k: np.zeros(x.shape, dtype=np.float64) for k, x in start.items()}
        count, new = len(good), {}
        for key, x in start.items():
            if x.dtype.kind != "f":
                new[key] = Array(x.copy())
                continue
            total = sum(np.asarray(c[self.arrayrecord_key][key].numpy(), dtype=np.float64) for c in contents)
            self.h[key] -= self.alpha * (total - count * x) / self.num_clients
            new[key] = Array(np.asarray(total / count - self.h[key] / self.alpha, dtype=x.dtype))
        self.acknowledge(server_round, good)
        return ArrayRecord(new), metrics
