"""Which clients train in a round: drawn from the run seed and the index of the
training round only, so every engine, and a vanilla and an Upcycled run, draw
the same clients for their k-th training round."""

from __future__ import annotations

from common.config import clients_per_round
from common.seeding import numpy_rng


def sample_partitions(seed: int, train_round: int, partitions: list[int], fraction: float,
                      population: int | None = None) -> list[int]:
    """Uniform sample without replacement from `partitions`, sorted.

    The sample size is taken from `population` (all clients, default: the
    candidates), capped by the candidates left (e.g. after budget refusals)."""
    if not partitions:
        return []
    k = min(clients_per_round(population or len(partitions), fraction), len(partitions))
    rng = numpy_rng(seed, "sample-clients", train_round)
    return sorted(int(p) for p in rng.choice(sorted(partitions), size=k, replace=False))
