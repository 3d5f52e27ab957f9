"""Deterministic randomness keyed by (seed, purpose, indices).

Every random draw in a run comes from a generator built here from the run seed
and the indices that identify the draw (client, training round, ...), never
from global state, so the in-process engine, Flower's simulation and a
deployment draw the same numbers, and a vanilla and an Upcycled run see the
same clients in their k-th training round.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def _key(seed: int, purpose: str, *indices: int) -> list[int]:
    return [int(seed), zlib.crc32(purpose.encode()), *(int(i) for i in indices)]


def numpy_rng(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    return np.random.default_rng(_key(seed, purpose, *indices))


def torch_generator(seed: int, purpose: str, *indices: int) -> torch.Generator:
    derived = int(np.random.SeedSequence(_key(seed, purpose, *indices)).generate_state(1, np.uint64)[0])
    return torch.Generator().manual_seed(derived & 0x7FFF_FFFF_FFFF_FFFF)
