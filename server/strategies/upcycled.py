"""Upcycled-FL (Yin et al., TMLR 2024) as a wrapper around any base strategy.

Rounds t = 1..2M. Odd round 2m-1 is the base strategy's m-th training round:
the wrapper delegates `configure_train` / `aggregate_train` to it. Even round
2m contacts no client (`configure_train` returns no message) and sets, in
`aggregate_train` with no replies,

    w_2m = w_2m-1 + theta_m (w_2m-1 - w_2m-2)                      (Eq. 6)

where w_2m-2 is the model the base trained from in round 2m-1 and w_2m-1 the
model after it. theta_m = mu/(mu + lambda_m) (Eq. 6 and the proof of Lemma
B.1; Algorithm 1's "lambda_m/2" is a typo), either a constant theta (the
authors' `--upcycled_param`, default 0.3) or from (mu, lambda) with
lambda_m = lambda * m^g: g = 0 is constant, g = 1/2 makes theta_m =
O(1/sqrt(m)), the increasing lambda_m of Corollary 5.8. Non-float arrays
(counters) are copied from w_2m-1, as the authors skip `num_batches_tracked`.

Choices (the paper says nothing of optimiser state on even rounds; these
follow the authors' code):
* The base is not called on even rounds, so server optimiser state (FedAvgM's
  momentum buffer, FedYogi's m and v, FedDyn's h) is left untouched; the
  extrapolated difference already includes the odd round's server step.
* A base with `upcycle_state(theta)` gets it called on even rounds: SCAFFOLD
  extrapolates its global control variate the same way
  (c += theta (1/N) sum delta c_i of the last odd round).
* Client draws: the base keys sampling, stragglers and client minibatch
  seeds on the training-round index, mapped here m = (t + 1) // 2, so vanilla
  round m and Upcycled round 2m-1 see identical draws.
* If the odd round produced no usable reply the model did not move
  (w_2m-1 = w_2m-2), and the even round reports no update either: a run in
  which no client ever trained must not look as if it had.
* Federated evaluation is delegated on odd rounds and skipped on even ones
  (no client receives any message on an even round).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy


def training_round(server_round: int) -> int:
    """Server round t -> index of the training round it belongs to (odd 2m-1 and even 2m -> m)."""
    return (server_round + 1) // 2


def theta_schedule(theta: float, mu: float = 0.0, lam: float = 0.0, growth: float = 0.0) -> Callable[[int], float]:
    """m -> theta_m: constant `theta` if lam == 0, else mu / (mu + lam * m**growth)."""
    if lam <= 0.0:
        return lambda m: float(theta)
    return lambda m: float(mu / (mu + lam * _power(float(m), growth)))


def _power(base: float, exponent: float) -> float:
    try:
        return base ** exponent
    except OverflowError:  # lambda_m beyond floats: theta_m = 0
        return math.inf


def extrapolate(current: ArrayRecord, previous: ArrayRecord, theta: float) -> ArrayRecord:
    """current + theta (current - previous), per array, in the arrays' own dtype."""
    out = {}
    for key, array in current.items():
        w1 = array.numpy()
        if w1.dtype.kind != "f":
            out[key] = Array(w1.copy())
            continue
        w0 = previous[key].numpy()
        out[key] = Array(np.asarray(w1 + theta * (w1 - w0), dtype=w1.dtype))
    return ArrayRecord(out)


class Upcycled(Strategy):
    def __init__(self, base: Strategy, theta: Callable[[int], float] | float = 0.3, log=print):
        self.base, self.log = base, log
        self.theta = theta if callable(theta) else theta_schedule(float(theta))
        if hasattr(base, "round_map"):
            base.round_map = training_round
        self._before: ArrayRecord | None = None  # w_2m-2: what the base trained from in round 2m-1
        self._after: ArrayRecord | None = None  # w_2m-1: the model handed in on round 2m
        self._odd_moved = True  # did round 2m-1 aggregate anything
        self.thetas: dict[int, float] = {}

    @staticmethod
    def is_even(server_round: int) -> bool:
        return server_round % 2 == 0

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.is_even(server_round):
            self._after = arrays
            return []
        self._before = arrays
        return self.base.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if not self.is_even(server_round):
            result = self.base.aggregate_train(server_round, replies)
            self._odd_moved = result[0] is not None
            return result
        stray = list(replies)
        if stray:
            self.log(f"round {server_round}: ignoring {len(stray)} replies on an even (server-only) round")
        if self._after is None or not self._odd_moved:
            return None, None
        m = server_round // 2
        theta = self.theta(m)
        self.thetas[server_round] = theta
        previous = self._before if self._before is not None else self._after
        new = extrapolate(self._after, previous, theta)
        if hasattr(self.base, "upcycle_state"):
            self.base.upcycle_state(theta)
        carried = getattr(self.base, "personal_metrics", dict)()  # pFedMe: its unchanged personalised models
        return new, MetricRecord({"upcycled-theta": theta, **carried})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if self.is_even(server_round):
            return []
        return self.base.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if self.is_even(server_round):
            return None
        return self.base.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.log("Upcycled-FL wrapper: even rounds extrapolate on the server")
        self.base.summary()
