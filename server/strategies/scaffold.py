"""SCAFFOLD (Karimireddy et al. 2020), option II control variates; not in Flower.

Each instruction carries the model x and the global control variate c (an
extra ArrayRecord, `control`); each reply carries the local model y_i and
delta c_i (`control-delta`). Clients keep their own c_i in `Context.state`
(client/updates/scaffold.py). The server, as in the Upcycled-FL code:

    x <- x + eta_g (sum_i p_i y_i - x)        (eta_g = 1: the p-weighted average)
    c <- c + (1/N) sum_{i in S} delta c_i     (N: all clients, S: this round's)

Both are sums over the sampled clients of per-client terms, the model one
weighted by num-examples and the control one with weight 1, so a secure
aggregation grid can mask the two ArrayRecords separately (each with its own
weight) and hand back only the two sums.

Upcycled-FL: on an even round the wrapper calls `upcycle_state(theta)`, which
does what the authors' code does there: c <- c + theta (1/N) sum delta c_i,
reusing the last odd round's sum (no client is contacted).

Replies carry two ArrayRecords, so `screened` checks `control-delta` against
c (names, shapes, finite values) and screens the rest as every strategy does.
"""

from __future__ import annotations

import copy
from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from client.updates.scaffold import CONTROL, CONTROL_DELTA
from server.replies import DROPPING, arrays_problem
from server.roster import Roster
from server.strategies.fedavg import RosterSampling


class Scaffold(RosterSampling, FlowerFedAvg):
    acknowledges = True  # c_i moves with the replies aggregated (client/updates/acknowledged.py)

    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *, server_lr: float = 1.0):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of))
        self.setup_sampling(roster, seed, fraction_train, log)
        self.server_lr = server_lr
        self.num_clients = len(roster.node_of)
        self.control: dict[str, np.ndarray] | None = None
        self.last_control_step: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.control is None:
            self.control = {k: np.zeros_like(a.numpy()) for k, a in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def extra_records(self, server_round: int) -> dict:
        return {CONTROL: ArrayRecord({k: Array(v.copy()) for k, v in self.control.items()})}

    # screening ---------------------------------------------------------------
    def _control_problem(self, content: RecordDict) -> str | None:
        delta = content.get(CONTROL_DELTA)
        if not isinstance(delta, ArrayRecord):
            return f"no {CONTROL_DELTA!r} ArrayRecord"
        return arrays_problem(delta, self.control, what=f"{CONTROL_DELTA!r} array")

    def screened(self, replies: Iterable[Message]) -> list[Message]:
        views, original = [], {}
        for msg in replies:
            view = msg
            if not msg.has_error():
                problem = self._control_problem(msg.content)
                if problem:
                    self.log(f"{DROPPING} from node {msg.metadata.src_node_id}: {problem}")
                    continue
                rest = RecordDict({k: v for k, v in msg.content.items() if k != CONTROL_DELTA})
                view = Message(content=rest, metadata=copy.copy(msg.metadata))
            views.append(view)
            original[id(view)] = msg
        return [original[id(v)] for v in super().screened(views)]

    # aggregation -------------------------------------------------------------
    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good = self.screened(replies)
        if not good:
            self.last_control_step = None
            return None, None
        models = [RecordDict({k: v for k, v in m.content.items() if k != CONTROL_DELTA}) for m in good]
        averaged = aggregate_arrayrecords(models, self.weighted_by_key)
        metrics = self.train_metrics_aggr_fn(models, self.weighted_by_key)
        if self.server_lr != 1.0:
            averaged = ArrayRecord({
                k: Array(np.asarray(x.numpy() + self.server_lr * (averaged[k].numpy() - x.numpy()),
                                    dtype=x.numpy().dtype))
                for k, x in self._sent.items()})
        step = {}
        for key, c in self.control.items():
            total = sum(np.asarray(m.content[CONTROL_DELTA][key].numpy(), dtype=np.float64) for m in good)
            step[key] = (total / self.num_clients).astype(c.dtype)
        self.control = {k: c + step[k] for k, c in self.control.items()}
        self.last_control_step = step
        self.acknowledge(server_round, good)
        return averaged, metrics

    def upcycle_state(self, theta: float) -> None:
        """Upcycled-FL even round: c <- c + theta (1/N) sum delta c_i of the last odd round."""
        if self.last_control_step is not None:
            self.control = {k: c + theta * self.last_control_step[k] for k, c in self.control.items()}
