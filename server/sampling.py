"""Which clients train in a round: drawn from the run seed and the index of the
training round only, so every engine, and a vanilla and an Upcycled run, draw
the same clients for their k-th training round."""

from __future__ import annotations

import math

from common.seeding import numpy_rng


def num_sampled(num_clients: int, fraction: float) -> int:
    """max(floor(fraction * N), 1), as the Upcycled-FL code (9 of 30 at 0.3)."""
    return max(math.floor(fraction * num_clients + 1e-9), 1)


def sample_partitions(seed: int, train_round: int, partitions: list[int], fraction: float,
                      population: int | None = None) -> list[int]:
    """Uniform sample without replacement from `partitions`, sorted.

    The sample size is taken from `population` (all clients, default: the
    candidates), capped by the candidates left (e.g. after budget refusals)."""
    if not partitions:
        return []
    k = min(num_sampled(population or len(partitions), fraction), len(partitions))
    rng = numpy_rng(seed, "sample-clients", train_round)
    return sorted(int(p) for p in rng.choice(sorted(partitions), size=k, replace=False))
