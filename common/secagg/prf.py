"""The PRF G(seed, round): a uniform mask vector in Z_(2^bits) from AES-256-CTR.

    G(seed, t)[0:length] = view_as_uint(AES-256-CTR_key=seed(nonce_t, 0^(length*w)))  mod 2^bits

* Key: the 32-byte pairwise seed (`keys.pair_seed`), which is already bound to
  the run, both node ids and both public keys. The seed is used for nothing
  but this PRF.
* Nonce (the 16-byte initial counter block of CTR mode):

      "PFM1" (4-byte domain tag) || u64(round) big-endian || u32 block counter = 0

  `cryptography`/OpenSSL increments the whole block as a 128-bit big-endian
  integer; the counter lives in the low 4 bytes, so one call may produce up to
  2^32 blocks (64 GiB) without the counter ever reaching the round field:
  distinct (tag, round) never share a keystream block. Rounds are unsigned
  64-bit ints; the run lives in the key.
* Context (optional): a digest of the round's announcement. With one, the AES
  key is HMAC-SHA256(seed, "PFM1-context" || context) instead of the seed, so
  two nodes whose announcements differ draw unrelated masks, and their masks no
  longer cancel: a server that tells nodes different things (a different weight
  scale, to weigh every other node to zero) decodes noise, not an update.
* Word size w: 4 bytes (uint32) when bits <= 32, else 8 bytes (uint64). The
  keystream bytes are viewed as little-endian words (explicit dtype '<u4' /
  '<u8', so the output is the same on every platform) and reduced mod 2^bits
  by a bit mask when bits is not 32 or 64. Because 2^bits divides 2^(8w), the
  reduction keeps the words exactly uniform (no modulo bias).
* Why AES-256-CTR: AES-NI makes it the fastest secure PRG in `cryptography`
  on the target machines (anchor: 0.61 ms per 10^6 uint32; ChaCha20 0.87 ms);
  it is a standard PRF/PRG assumption; 256-bit keys use the full seed.

Speed: the keystream is written with `update_into` into a small reusable
buffer (allocating a fresh 8 MB `bytes` per call is 4x slower) and added to
the vector chunk by chunk while both are in cache (`MaskGenerator`, about
30% faster than full-length masks). On the 2-core CI box one mask of 10^6
uint64 words costs about 1.3-1.7 ms of CPU including the add (uint32:
0.7 ms). `mask_vector` is the one-shot convenience that returns a fresh
array.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from common.number_checks import is_int
from .keys import SEED_BYTES, check_u64

__all__ = ["DOMAIN_TAG", "MAX_WORDS_BYTES", "word_dtype", "nonce", "round_key", "MaskGenerator", "mask_vector"]

DOMAIN_TAG = b"PFM1"
_BLOCK = 16
MAX_WORDS_BYTES = (1 << 32) * _BLOCK  # keystream bytes per (seed, round)
_CHUNK_BYTES = 1 << 18  # 256 KiB: a keystream chunk plus a slice of the vector stay in cache


def word_dtype(bits: int) -> np.dtype:
    """Little-endian uint32 for bits <= 32, uint64 otherwise (1 <= bits <= 64)."""
    if not is_int(bits) or not 1 <= bits <= 64:
        raise ValueError(f"bits must be an int in [1, 64], got {bits!r}")
    return np.dtype("<u4") if bits <= 32 else np.dtype("<u8")


def nonce(round_: int) -> bytes:
    """The CTR initial counter block for `round_`: tag || u64(round) || u32(0)."""
    r = check_u64("round", round_)
    return DOMAIN_TAG + r.to_bytes(8, "big") + b"\x00\x00\x00\x00"


def round_key(seed: bytes, context: bytes = b"") -> bytes:
    """The AES key of a pair's masks: the seed itself, or bound to the round's announcement `context`."""
    if not context:
        return bytes(seed)
    mac = hmac.HMAC(bytes(seed), hashes.SHA256())
    mac.update(DOMAIN_TAG + b"-context" + bytes(context))
    return mac.finalize()


class MaskGenerator:
    """Cache-friendly accumulation of signed PRF outputs for one word size.

    `accumulate(words, round_, terms)` computes, in place,

        words += sum_{(seed, sign) in terms} sign * G(seed, round_)   mod 2^w

    chunk by chunk: one AES-CTR stream per seed is kept open and advanced
    `_CHUNK_BYTES` at a time, so the keystream chunk and the slice of `words`
    stay in the CPU cache (about 30% faster than generating each full-length
    mask and adding it). The result is bit-identical to adding full
    `mask_vector`s. Not thread-safe (one per thread); buffers are 2 x 256 KiB.
    Reduction mod 2^bits below the word size is left to the caller
    (`masking.reduce_mod`), once, after all terms.
    """

    def __init__(self, bits: int) -> None:
        self.bits = int(bits)
        self.dtype = word_dtype(bits)
        self._zeros = np.zeros(_CHUNK_BYTES, dtype=np.uint8)
        self._buf = np.empty(_CHUNK_BYTES // self.dtype.itemsize, dtype=self.dtype)

    def accumulate(self, words: np.ndarray, round_: int, terms: Iterable[tuple[bytes, int]],
                   context: bytes = b"") -> np.ndarray:
        """In place: words += sum sign * G(seed, round_) mod 2^w, w the word size; returns words.
        `context`: the round's announcement digest (module docstring)."""
        if words.dtype != self.dtype or words.ndim != 1 or not words.flags.c_contiguous:
            raise TypeError(f"words must be a contiguous 1-D {self.dtype} array")
        n = nonce(round_)
        encs = []
        for seed, sign in terms:
            if len(seed) != SEED_BYTES:
                raise ValueError(f"seed must be {SEED_BYTES} bytes, got {len(seed)}")
            if sign not in (1, -1):
                raise ValueError(f"sign must be +1 or -1, got {sign!r}")
            encs.append((Cipher(algorithms.AES(round_key(seed, context)), modes.CTR(n)).encryptor(), sign))
        length = words.shape[0]
        if length * self.dtype.itemsize > MAX_WORDS_BYTES:
            raise ValueError(f"length {length} needs more than 2^32 AES blocks per round")
        step = self._buf.shape[0]
        bufb = self._buf.view(np.uint8)
        for start in range(0, length, step):
            cnt = min(step, length - start)
            nb = cnt * self.dtype.itemsize
            w = words[start:start + cnt]
            g = self._buf[:cnt]
            for enc, sign in encs:
                enc.update_into(self._zeros[:nb], bufb[:nb])
                if sign > 0:
                    np.add(w, g, out=w)
                else:
                    np.subtract(w, g, out=w)
        return words


def mask_vector(seed: bytes, round_: int, length: int, bits: int, context: bytes = b"") -> np.ndarray:
    """G(seed, round_) (bound to `context` if given): a fresh array of `length` words uniform in [0, 2^bits).

    dtype uint32 if bits <= 32 else uint64 (little-endian).
    """
    if not is_int(length) or length < 0:
        raise ValueError(f"length must be a non-negative int, got {length!r}")
    dtype = word_dtype(bits)
    out = np.zeros(int(length), dtype=dtype)
    MaskGenerator(bits).accumulate(out, round_, [(seed, 1)], context)
    full = dtype.itemsize * 8
    if bits < full:
        np.bitwise_and(out, dtype.type((1 << bits) - 1), out=out)
    return out
