"""Stragglers: sampled clients that cannot finish their local epochs.

As in the Upcycled-FL code, each sampled client independently becomes a
straggler with probability `fraction` (so `fraction` is the expected share of
stragglers among the sampled clients, e.g. 0.9 in the paper's Table 1). A
straggler runs E' = floor(U * E) local epochs, U ~ Uniform[0, 1), with U
redrawn while E' = 0; so E' is uniform on {1, ..., E-1}. With E = 1 there is
no shorter run, and a straggler runs its one epoch. Straggler updates are
still aggregated (they are not dropped).

Draws come from (run seed, training round, partition) only, so a vanilla run's
training round m and an Upcycled run's round 2m-1 (its m-th training round)
see the same stragglers with the same epochs, whatever the strategy.
"""

from __future__ import annotations

import math
from typing import Iterable

from common.seeding import numpy_rng


def shortened_epochs(rng, epochs: int) -> int:
    """floor(U * E) with U redrawn until the result is >= 1 (E = 1: 1)."""
    if epochs <= 1:
        return 1
    while True:
        short = math.floor(rng.random() * epochs)
        if short >= 1:
            return short


def straggler_epochs(seed: int, train_round: int, partitions: Iterable[int], fraction: float,
                     epochs: int) -> dict[int, int]:
    """partition -> local epochs, for the stragglers among the sampled `partitions` only."""
    out: dict[int, int] = {}
    if fraction <= 0.0:
        return out
    for p in partitions:
        rng = numpy_rng(seed, "stragglers", train_round, p)
        if rng.random() < fraction:
            out[int(p)] = shortened_epochs(rng, epochs)
    return out
