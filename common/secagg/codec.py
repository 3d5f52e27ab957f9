"""Fixed-point codec: reals in [-B, B] <-> integers mod 2^k, with headroom for a sum.

Parameters (`CodecParams`):

* k = `mod_bits` (2..64): arithmetic is mod 2^k on uint32 words (k <= 32) or
  uint64 words (k > 32). numpy's unsigned add/subtract wrap mod 2^32 / 2^64
  natively, and 2^k divides both, so a final bit mask gives mod 2^k.
* f = `frac_bits`: scale 2^f. encode(x) = round_half_even(x * 2^f) mod 2^k.
* B = `clip`: every encoded value must satisfy |x| <= B. A value outside
  (or NaN/inf) raises `CodecRangeError` (a `ValueError`) naming the index and
  value; nothing is clipped unless the caller passes `clip=True` explicitly.
* n_max = `max_clients`: the most contributions ever summed (the size of a
  selected set).

Headroom. Let Q = round(B * 2^f) (the largest |quantised value| of one client).
The parameters are accepted only if

    n_max * Q <= 2^(k-1) - 1,

so a sum of at most n_max encoded values lies in (-2^(k-1), 2^(k-1)) and the
decoder's two's-complement centring (residues >= 2^(k-1) are negative) is
exact: a sum can never wrap silently. The protocol refuses rounds with more
than n_max selected clients, so the bound holds for every decoded sum.

Quantisation bound. For x in float64 with |x| <= B, x * 2^f is exact (a power
of two scaling), rounding to the nearest integer errs by at most 1/2, and
integer -> float64 -> / 2^f adds only float64 rounding. Hence

    one value:       |decode(encode(x)) - x|            <= 2^-(f+1)
    sum of n values: |decode(sum encode(x_i)) - sum x_i| <= n * 2^-(f+1) + 2^-52 * |sum x_i|

(the second term is float64 rounding of the decoded integer; it is zero while
|sum| * 2^f < 2^53). `CodecParams.sum_error_bound(n, magnitude)` returns it.

Defaults (64-bit words): k = 64, f = 32, B = 2^20, n_max = 1024:
Q = 2^52, n_max * Q = 2^62 < 2^63 - 1; step 2^-32 = 2.3e-10, one-value error
1.2e-10, far below float32 resolution, for values up to about 10^6 (room for
weight * update with example-count weights). `CodecParams.compact()` is the
32-bit wire format (half the bytes): k = 32, B = 2^10, n_max = 16 and the
largest f that fits (f = 16, error 7.6e-6 per value); `CodecParams.fit` picks
f for any (k, B, n_max).

In the protocol the encoded vector is x_i = [w_i * u_i, w_i, metrics_i], with
w_i rounded to the step 2^-f first (so sum(w) decodes exactly), so B bounds
|weight * update| (and the weight, hence B >= 1 for weights up to 1, and the
metric values), and the weighted mean sum(w u) / sum(w) with those weights is
within the sum bound / sum(w).
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass

import numpy as np

from common.number_checks import is_int, is_real
from .prf import word_dtype

__all__ = ["CodecParams", "CodecRangeError", "FixedPointCodec"]


class CodecRangeError(ValueError):
    """A value to encode is outside [-clip, clip] or not finite.

    Attributes: `index` (flat index of the first offending entry), `value`,
    `bound`.
    """

    def __init__(self, message: str, index: int, value: float, bound: float) -> None:
        super().__init__(message)
        self.index = index
        self.value = value
        self.bound = bound


def _q_max(clip: float, frac_bits: int) -> int:
    return int(np.rint(np.float64(clip) * np.float64(2.0) ** frac_bits))


@dataclass(frozen=True)
class CodecParams:
    """Modulus 2^mod_bits, scale 2^frac_bits, clip bound, and max summands (see module doc)."""

    mod_bits: int = 64
    frac_bits: int = 32
    clip: float = float(2**20)
    max_clients: int = 1024

    def __post_init__(self) -> None:
        for name in ("mod_bits", "frac_bits", "max_clients"):
            v = getattr(self, name)
            if not is_int(v):
                raise TypeError(f"CodecParams.{name} must be an int, got {v!r}")
        if not 2 <= self.mod_bits <= 64:
            raise ValueError(f"mod_bits must be in [2, 64], got {self.mod_bits}")
        if not 0 <= self.frac_bits <= 1000:
            raise ValueError(f"frac_bits must be in [0, 1000], got {self.frac_bits}")
        if self.max_clients < 1:
            raise ValueError(f"max_clients must be >= 1, got {self.max_clients}")
        if not (is_real(self.clip) and math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a finite positive number, got {self.clip!r}")
        object.__setattr__(self, "clip", float(self.clip))
        limit = (1 << (self.mod_bits - 1)) - 1
        need = self.max_clients * _q_max(self.clip, self.frac_bits)
        if need > limit:
            raise ValueError(
                f"no headroom: max_clients * round(clip * 2^frac_bits) = {need} > 2^(mod_bits-1) - 1"
                f" = {limit} (mod_bits={self.mod_bits}, frac_bits={self.frac_bits},"
                f" clip={self.clip}, max_clients={self.max_clients}); lower frac_bits or clip,"
                " or use CodecParams.fit"
            )

    @classmethod
    def fit(cls, mod_bits: int, clip: float, max_clients: int) -> "CodecParams":
        """The finest scale (largest frac_bits) with headroom for (mod_bits, clip, max_clients)."""
        limit = (1 << (mod_bits - 1)) - 1
        best = None
        for f in range(0, 1001):
            if max_clients * _q_max(clip, f) > limit:
                break
            best = f
        if best is None:
            raise ValueError(
                f"no fixed-point scale fits: max_clients={max_clients} * clip={clip} already"
                f" exceeds 2^(mod_bits-1) - 1 for mod_bits={mod_bits}"
            )
        return cls(mod_bits=mod_bits, frac_bits=best, clip=clip, max_clients=max_clients)

    @classmethod
    def compact(cls, clip: float = float(2**10), max_clients: int = 16) -> "CodecParams":
        """32-bit words (half the bytes of the default), finest scale that fits."""
        return cls.fit(32, clip, max_clients)

    @property
    def modulus(self) -> int:
        """2^mod_bits."""
        return 1 << self.mod_bits

    @property
    def scale(self) -> float:
        """2^frac_bits."""
        return float(2.0**self.frac_bits)

    @property
    def dtype(self) -> np.dtype:
        """Wire/arithmetic dtype: uint32 for mod_bits <= 32, else uint64 (little-endian)."""
        return word_dtype(self.mod_bits)

    @property
    def q_max(self) -> int:
        """round(clip * 2^frac_bits): the largest |encoded value| of one client."""
        return _q_max(self.clip, self.frac_bits)

    @property
    def step_error(self) -> float:
        """Per-value quantisation bound 2^-(frac_bits+1)."""
        return float(2.0 ** -(self.frac_bits + 1))

    def sum_error_bound(self, n: int, magnitude: float = 0.0) -> float:
        """Bound on |decoded sum - exact sum| for n values with |exact sum| <= magnitude."""
        return n * self.step_error + 2.0**-52 * abs(magnitude)

    def fingerprint(self) -> bytes:
        """A stable byte string identifying these parameters (hashed into message contexts)."""
        raw = struct.pack(">BHdI", self.mod_bits, self.frac_bits, self.clip, self.max_clients)
        return hashlib.sha256(b"privfed/secagg/v1/codec" + raw).digest()


class FixedPointCodec:
    """Encode float vectors to Z_(2^k) words and decode (centred) sums back."""

    def __init__(self, params: CodecParams | None = None) -> None:
        self.params = params if params is not None else CodecParams()
        p = self.params
        self.dtype = p.dtype
        self._scale = np.float64(p.scale)
        self._clip = np.float64(p.clip)
        full = self.dtype.itemsize * 8
        self._mask = None if p.mod_bits == full else self.dtype.type((1 << p.mod_bits) - 1)
        # signed dtype of the same width: int32 / int64 casts wrap exactly like mod 2^w
        self._signed = np.dtype("<i4") if self.dtype.itemsize == 4 else np.dtype("<i8")

    def check_range(self, x: np.ndarray, *, scaled: bool = False) -> None:
        """Raise CodecRangeError for the first entry with |x| > clip or not finite.

        With `scaled=True`, `x` holds values already multiplied by 2^f and the
        bound is clip * 2^f (the error still reports the unscaled value).
        Two reductions (min, max) and no temporary unless a value is bad.
        """
        x = np.asarray(x)
        if x.size == 0:
            return
        bound = self._clip * self._scale if scaled else self._clip
        lo, hi = x.min(), x.max()  # NaN propagates and fails both tests
        if lo >= -bound and hi <= bound:
            return
        bad = ~(np.abs(x) <= bound)
        idx = int(np.flatnonzero(bad.ravel())[0])
        val = float(x.ravel()[idx]) / (float(self._scale) if scaled else 1.0)
        raise CodecRangeError(
            f"value {val!r} at index {idx} is outside [-{self.params.clip}, {self.params.clip}]"
            " (the codec's clip bound; pass clip=True to clip explicitly)",
            idx,
            val,
            self.params.clip,
        )

    def encode(self, x: np.ndarray, *, clip: bool = False) -> np.ndarray:
        """Words round(x * 2^f) mod 2^k (dtype `self.dtype`) of a 1-D real array.

        Raises CodecRangeError when any |x| > clip (or x is NaN/inf) unless
        `clip=True`, in which case values are clipped to [-clip, clip] first
        (NaN still raises).
        """
        x = np.asarray(x)
        if x.ndim != 1:
            raise ValueError(f"encode expects a 1-D array, got shape {x.shape}")
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise TypeError(f"encode expects a real array, got dtype {x.dtype}")
        y = np.multiply(x, self._scale, dtype=np.float64)
        return self.encode_scaled_inplace(y, clip=clip)

    def encode_scaled_inplace(self, y: np.ndarray, *, clip: bool = False) -> np.ndarray:
        """Encode a float64 array holding x * 2^f, which the caller owns (it is overwritten).

        For callers that fold the scale into another product (weight * 2^f *
        update) to save a pass; multiplying by 2^f is exact, so the result is
        bit-identical to `encode(x)`.
        """
        if y.dtype != np.float64 or y.ndim != 1:
            raise TypeError("encode_scaled_inplace expects a 1-D float64 array")
        if clip:
            if y.size and np.isnan(y).any():
                self.check_range(y, scaled=True)
            bound = self._clip * self._scale
            np.clip(y, -bound, bound, out=y)
        self.check_range(y, scaled=True)
        np.rint(y, out=y)
        # |y| <= q_max < 2^(k-1) <= 2^(w-1): fits the signed word; the bit
        # pattern of the signed word is the residue mod 2^w.
        words = y.astype(self._signed).view(self.dtype)
        if self._mask is not None:
            np.bitwise_and(words, self._mask, out=words)
        return words

    def centre(self, words: np.ndarray) -> np.ndarray:
        """Signed integers (int64) congruent to `words` mod 2^k, in [-2^(k-1), 2^(k-1))."""
        words = np.asarray(words)
        if words.dtype != self.dtype:
            raise TypeError(f"expected dtype {self.dtype}, got {words.dtype}")
        k = self.params.mod_bits
        full = self.dtype.itemsize * 8
        if k == full:
            return words.view(self._signed).astype(np.int64)
        # sign-extend bit k-1: shift it to bit 63, then arithmetic shift back
        sh = np.int64(64 - k)
        s = words.astype(np.int64)
        np.left_shift(s, sh, out=s)
        np.right_shift(s, sh, out=s)
        return s

    def decode(self, words: np.ndarray) -> np.ndarray:
        """float64 reals from words holding one encoded vector or a sum of <= max_clients."""
        return self.centre(words).astype(np.float64) / self._scale
