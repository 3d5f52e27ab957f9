"""FedAvgM (Hsu et al. 2019): server SGD with momentum on the pseudo-gradient
x - sum_i p_i w_i, server lr 1, on Flower's `FedAvgM`.

Where Flower's `FedAvgM` differs from the Upcycled-FL code, and what we do:

* Nesterov. The authors step `torch.optim.SGD(lr=1, momentum=beta,
  nesterov=True)`: buf = g (first step), then buf = beta buf + g, and
  x <- x - (g + beta buf). Flower's FedAvgM is heavy-ball (x <- x - buf).
  `server-nesterov = true` (default) does the authors' step here;
  `false` runs Flower's own update.
* The model the pseudo-gradient is taken from. Flower keeps its own copy of
  the last aggregate and ignores the `arrays` handed to later
  `configure_train` calls. Under Upcycled-FL the global model moves on even
  rounds without the strategy, so we refresh that copy from `arrays` every
  round: the pseudo-gradient is always x_sent - average, as in the authors'
  code (their server optimiser steps the loaded model).
* The momentum buffer (`momentum_vector`, Flower's name and list layout) is
  only touched by `aggregate_train`, so Upcycled's even rounds leave it as is.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM

from server.roster import Roster
from server.strategies.fedavg import RosterSampling


class FedAvgM(RosterSampling, FlowerFedAvgM):
    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *,
                 server_momentum: float = 0.3, nesterov: bool = True):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of), server_learning_rate=1.0,
                         server_momentum=server_momentum)
        self.nesterov = nesterov
        self.setup_sampling(roster, seed, fraction_train, log)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = self.screened(replies)
        if not self.nesterov:
            return FlowerFedAvgM.aggregate_train(self, server_round, replies)
        averaged, metrics = FlowerFedAvg.aggregate_train(self, server_round, replies)
        if averaged is None:
            return None, metrics
        keys = list(averaged.keys())
        start = [self.current_arrays[k].numpy() for k in keys]
        pseudo = [x - a for x, a in zip(start, (averaged[k].numpy() for k in keys))]
        beta = self.server_momentum
        if self.momentum_vector is None:
            self.momentum_vector = [g.copy() for g in pseudo]
        else:
            self.momentum_vector = [beta * b + g for b, g in zip(self.momentum_vector, pseudo)]
        step = [g + beta * b for g, b in zip(pseudo, self.momentum_vector)]
        lr = self.server_learning_rate
        new = ArrayRecord({k: Array(np.asarray(x - lr * d, dtype=x.dtype)) for k, x, d in zip(keys, start, step)})
        self.current_arrays = new
        return new, metrics
