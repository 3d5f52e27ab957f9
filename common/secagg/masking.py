"""Pairwise mask arithmetic mod 2^k.

Client i, selected set Omega_t, pairwise seeds seed_ij (one per unordered pair,
`keys.pair_seed`):

    r_i^t = sum_{j in Omega_t, j != i} sign(i, j) * G(seed_ij, t)   mod 2^k
    sign(i, j) = +1 if i < j else -1        (node-id order)

so sign(i, j) * G + sign(j, i) * G = 0 and sum_{i in Omega_t} r_i^t = 0 mod 2^k:
the masks cancel in the server's sum. This is the paper's Eq. (7) with the
ordered-pair convention (zcdp-secagg.md, item 6).

All functions work in place on uint32 / uint64 arrays: numpy unsigned add and
subtract wrap mod 2^32 / 2^64, and for k below the word size one bit mask at
the end reduces mod 2^k (2^k divides the word modulus, so wrapping first and
masking last is exact). No Python loop runs over coordinates; the only loop is
over peers.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from .prf import MaskGenerator, word_dtype

__all__ = ["mask_sign", "reduce_mod", "add_pairwise_masks", "pairwise_mask_sum"]


def mask_sign(my_id: int, peer_id: int) -> int:
    """+1 if my_id < peer_id, -1 if my_id > peer_id; ValueError if equal."""
    if my_id == peer_id:
        raise ValueError(f"no pairwise mask with oneself (node {my_id})")
    return 1 if my_id < peer_id else -1


def reduce_mod(words: np.ndarray, bits: int) -> np.ndarray:
    """In place: words mod 2^bits (a no-op when bits equals the word size)."""
    full = words.dtype.itemsize * 8
    if bits < full:
        np.bitwise_and(words, words.dtype.type((1 << bits) - 1), out=words)
    return words


def add_pairwise_masks(
    words: np.ndarray,
    my_id: int,
    seeds: Mapping[int, bytes],
    peers: Iterable[int],
    round_: int,
    bits: int,
    *,
    generator: MaskGenerator | None = None,
    sign: int = 1,
    context: bytes = b"",
) -> np.ndarray:
    """In place: words += sign * sum_{j in peers} sign(my_id, j) * G(seeds[j], round_)  mod 2^bits.

    `peers` must not contain `my_id`; every peer needs a seed (KeyError
    otherwise). `sign=-1` removes masks that were added. `context`: the round's
    announcement digest, which the masks are bound to (`prf.round_key`). Returns `words`.
    """
    dtype = word_dtype(bits)
    if words.dtype != dtype or words.ndim != 1:
        raise TypeError(f"words must be a 1-D {dtype} array, got {words.ndim}-D {words.dtype}")
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")
    if generator is None or generator.bits != bits:
        generator = MaskGenerator(bits)
    terms = [(seeds[peer], mask_sign(my_id, peer) * sign) for peer in sorted(peers)]
    generator.accumulate(words, round_, terms, context)
    return reduce_mod(words, bits)


def pairwise_mask_sum(
    my_id: int,
    seeds: Mapping[int, bytes],
    peers: Iterable[int],
    round_: int,
    length: int,
    bits: int,
    *,
    generator: MaskGenerator | None = None,
    context: bytes = b"",
) -> np.ndarray:
    """sum_{j in peers} sign(my_id, j) * G(seeds[j], round_) mod 2^bits, as a fresh array."""
    out = np.zeros(length, dtype=word_dtype(bits))
    return add_pairwise_masks(out, my_id, seeds, peers, round_, bits, generator=generator, context=context)
