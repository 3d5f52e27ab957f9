"""Deterministic randomness keyed by (seed, purpose, indices).

Every random draw in a run comes from a generator built here from the run seed
and the indices that identify the draw (client, training round, ...), never
from global state, so the in-process engine, Flower's simulation and a
deployment draw the same numbers, and a vanilla and an Upcycled run see the
same clients in their k-th training round.

The exception is a private mechanism's randomness (DP noise, Poisson sampling,
Hu's batches): `mechanism_seed` gives its root seed, by default fresh OS
randomness (run config `dp-noise-seed`), because noise that anyone who knows
the run seed can regenerate protects nothing.
"""

from __future__ import annotations

import contextlib
import secrets
import zlib
from typing import Any, Iterator, Mapping

import numpy as np
import torch


def _key(seed: int, purpose: str, *indices: int) -> list[int]:
    return [int(seed), zlib.crc32(purpose.encode()), *(int(i) for i in indices)]


def numpy_rng(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    return np.random.default_rng(_key(seed, purpose, *indices))


def torch_generator(seed: int, purpose: str, *indices: int, device: torch.device | str = "cpu") -> torch.Generator:
    """`device`: where the draws happen (torch refuses a CPU generator for a draw on CUDA)."""
    derived = int(np.random.SeedSequence(_key(seed, purpose, *indices)).generate_state(1, np.uint64)[0])
    return torch.Generator(device=device).manual_seed(derived & 0x7FFF_FFFF_FFFF_FFFF)


@contextlib.contextmanager
def global_torch_rng(seed: int, purpose: str, *indices: int, device: torch.device | None = None) -> Iterator[None]:
    """torch's global generators (CPU, and `device` if a GPU), seeded from the key inside the block and
    restored after: for draws that cannot take a generator, such as nn.Dropout's masks. A CPU client
    never touches CUDA (its context costs GPU memory, and an exclusive GPU refuses a second process)."""
    gpu = device is not None and torch.device(device).type == "cuda"
    devices = [torch.device(device).index or 0] if gpu else []
    derived = torch_generator(seed, purpose, *indices).initial_seed()
    with torch.random.fork_rng(devices=devices):
        # Not torch.manual_seed: it also queues a seed, with a captured stack trace, for every lazily
        # initialised backend (CUDA, XPU, MTIA) of a CPU process: 0.3 ms instead of 0.03 ms a client round.
        # The client's own accelerator is seeded below.
        torch.default_generator.manual_seed(derived)
        if gpu:
            with torch.cuda.device(devices[0]):
                torch.cuda.manual_seed(derived)
        elif device is not None and torch.device(device).type == "mps":
            torch.mps.manual_seed(derived)  # seeded as torch.manual_seed did (fork_rng cannot restore it)
        yield


def mechanism_seed(config: Mapping[str, Any]) -> int:
    """Root seed of a private mechanism's generators; call once per client and round, key with purpose.

    'secret': 128 fresh bits from the OS (nobody can regenerate the noise or the sampled batch).
    'run-seed': the public run seed, so the draws are those of `numpy_rng(seed, ...)` and
    `torch_generator(seed, ...)`: reproducible, private only against parties who do not know the config.
    """
    mode = str(config.get("dp-noise-seed", "secret"))
    if mode == "secret":
        return secrets.randbits(128)
    if mode == "run-seed":
        return int(config["seed"])
    raise ValueError(f"dp-noise-seed must be 'secret' or 'run-seed', got {mode!r}")
