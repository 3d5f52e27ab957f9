"""Secure-aggregation primitives: key agreement, PRF, fixed-point codec, mask arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from common.secagg import (
    CodecParams,
    CodecRangeError,
    FixedPointCodec,
    KeyPair,
    MaskGenerator,
    add_pairwise_masks,
    mask_sign,
    mask_vector,
    pair_seed,
    pairwise_mask_sum,
)
from common.secagg.masking import reduce_mod
from common.secagg.prf import nonce

U64 = 2**64 - 1


# ---------------------------------------------------------------- keys
def test_two_clients_derive_the_same_pair_seed():
    a, b = KeyPair.generate(), KeyPair.generate()
    for ia, ib in [(3, 9), (U64, 0), (2**63, 2**63 + 1)]:
        s_ab = pair_seed(a, b.public_bytes, 42, ia, ib)
        s_ba = pair_seed(b, a.public_bytes, 42, ib, ia)
        assert s_ab == s_ba
        assert len(s_ab) == 32


def test_seeds_differ_across_runs_pairs_and_keys():
    a, b, c = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    base = pair_seed(a, b.public_bytes, 1, 10, 20)
    assert pair_seed(a, b.public_bytes, 2, 10, 20) != base  # other run
    assert pair_seed(a, b.public_bytes, 1, 10, 21) != base  # other peer id, same keys
    assert pair_seed(a, b.public_bytes, 1, 11, 20) != base  # other own id
    assert pair_seed(a, c.public_bytes, 1, 10, 20) != base  # other peer key
    assert pair_seed(a, c.public_bytes, 1, 10, 30) != pair_seed(b, c.public_bytes, 1, 20, 30)


def test_pair_seed_rejects_bad_inputs():
    a, b = KeyPair.generate(), KeyPair.generate()
    with pytest.raises(ValueError):
        pair_seed(a, b.public_bytes, 1, 5, 5)
    with pytest.raises(ValueError):
        pair_seed(a, b.public_bytes, 1, 2**64, 5)
    with pytest.raises(ValueError):
        pair_seed(a, b.public_bytes, -1, 1, 5)
    with pytest.raises(TypeError):
        pair_seed(a, b.public_bytes, 1, True, 5)
    with pytest.raises(ValueError):
        pair_seed(a, b.public_bytes[:31], 1, 1, 5)
    with pytest.raises(ValueError):  # low-order point: all-zero shared secret
        pair_seed(a, bytes(32), 1, 1, 5)


def test_keypair_private_bytes_round_trip():
    a = KeyPair.generate()
    assert KeyPair.from_private_bytes(a.private_bytes()).public_bytes == a.public_bytes


# ---------------------------------------------------------------- PRF
def test_mask_vector_is_aes256_ctr_keystream_with_round_in_nonce():
    seed = bytes(range(32))
    v = mask_vector(seed, 7, 100, 64)
    assert v.dtype == np.dtype("<u8") and v.shape == (100,)
    ks = Cipher(algorithms.AES(seed), modes.CTR(b"PFM1" + (7).to_bytes(8, "big") + bytes(4))).encryptor()
    expected = np.frombuffer(ks.update(bytes(800)), dtype="<u8")
    np.testing.assert_array_equal(v, expected)
    assert nonce(7)[4:12] == (7).to_bytes(8, "big")


def test_mask_vector_depends_on_seed_and_round_and_is_deterministic():
    s1, s2 = b"\x01" * 32, b"\x02" * 32
    a = mask_vector(s1, 1, 1000, 64)
    np.testing.assert_array_equal(a, mask_vector(s1, 1, 1000, 64))
    assert not np.array_equal(a, mask_vector(s1, 2, 1000, 64))
    assert not np.array_equal(a, mask_vector(s2, 1, 1000, 64))
    # prefix property: a longer vector starts with the shorter one
    np.testing.assert_array_equal(mask_vector(s1, 1, 10, 64), a[:10])
    mask_vector(s1, U64, 4, 64)
    with pytest.raises(ValueError):
        mask_vector(s1, 2**64, 4, 64)
    with pytest.raises(ValueError):
        mask_vector(b"short", 1, 4, 64)


@pytest.mark.parametrize("bits", [1, 20, 32, 40, 63, 64])
def test_mask_vector_range_and_dtype(bits):
    v = mask_vector(b"\x05" * 32, 3, 20_000, bits)
    assert v.dtype == (np.dtype("<u4") if bits <= 32 else np.dtype("<u8"))
    assert int(v.max()) < 2**bits
    # the top bit of the range is used (not a narrower range)
    assert int(v.max()) >= 2 ** (bits - 1)


@pytest.mark.parametrize("bits", [64, 32, 20])
def test_chunked_accumulate_equals_full_masks(bits):
    length = 100_003  # several chunks, ragged tail
    seeds = [bytes([i]) * 32 for i in range(1, 5)]
    signs = [1, -1, -1, 1]
    dtype = np.dtype("<u4") if bits <= 32 else np.dtype("<u8")
    words = np.arange(length, dtype=dtype)
    expected = words.copy()
    for s, g in zip(seeds, signs):
        m = mask_vector(s, 9, length, bits)
        expected = expected + m if g > 0 else expected - m
    reduce_mod(expected, bits)
    MaskGenerator(bits).accumulate(words, 9, list(zip(seeds, signs)))
    reduce_mod(words, bits)
    np.testing.assert_array_equal(words, expected)


# ---------------------------------------------------------------- codec
def test_codec_default_parameters_are_valid_and_documented():
    p = CodecParams()
    assert (p.mod_bits, p.frac_bits, p.clip, p.max_clients) == (64, 32, 2.0**20, 1024)
    assert p.max_clients * p.q_max <= 2**63 - 1
    c = CodecParams.compact()
    assert c.mod_bits == 32 and c.frac_bits == 16 and c.max_clients * c.q_max <= 2**31 - 1


def test_codec_headroom_is_enforced():
    with pytest.raises(ValueError, match="headroom"):
        CodecParams(mod_bits=32, frac_bits=20, clip=1024.0, max_clients=16)
    f = CodecParams.fit(32, 1000.0, 10)
    assert 10 * f.q_max <= 2**31 - 1
    with pytest.raises(ValueError):
        CodecParams(mod_bits=32, frac_bits=f.frac_bits + 1, clip=1000.0, max_clients=10)


@pytest.mark.parametrize(
    "params",
    [CodecParams(), CodecParams.compact(), CodecParams(mod_bits=40, frac_bits=12, clip=100.0, max_clients=64),
     CodecParams(mod_bits=63, frac_bits=30, clip=2.0**20, max_clients=512),
     CodecParams(mod_bits=20, frac_bits=8, clip=100.0, max_clients=8)],
)
def test_codec_round_trip_and_sum_within_documented_bound(params):
    codec = FixedPointCodec(params)
    rng = np.random.default_rng(0)
    n = min(params.max_clients, 10)
    xs = [rng.uniform(-params.clip, params.clip, 5000) for _ in range(n)]
    xs[0][:2] = [params.clip, -params.clip]
    one = codec.decode(codec.encode(xs[0]))
    assert np.max(np.abs(one - xs[0])) <= params.step_error
    total = np.zeros(5000, dtype=params.dtype)
    for x in xs:
        total = total + codec.encode(x)
    reduce_mod(total, params.mod_bits)
    exact = np.sum(xs, axis=0)
    err = np.abs(codec.decode(total) - exact)
    bound = n * params.step_error + 2.0**-52 * np.abs(exact) + 2.0**-50 * np.sum(np.abs(xs), axis=0)
    assert np.all(err <= bound)  # last term: float64 rounding of the reference sum itself


@pytest.mark.parametrize("params", [CodecParams(), CodecParams.compact(),
                                    CodecParams(mod_bits=20, frac_bits=8, clip=100.0, max_clients=8)])
def test_codec_headroom_extremes_decode_exactly(params):
    """max_clients values all at +clip (or -clip) still decode: no wrap."""
    codec = FixedPointCodec(params)
    for sign in (1.0, -1.0):
        e = codec.encode(np.array([sign * params.clip]))
        total = np.zeros(1, dtype=params.dtype)
        for _ in range(params.max_clients):
            total = total + e
        reduce_mod(total, params.mod_bits)
        assert codec.decode(total)[0] == sign * params.max_clients * params.q_max / params.scale


def test_encode_out_of_range_raises_naming_index_and_value():
    codec = FixedPointCodec(CodecParams.compact())
    x = np.zeros(10)
    x[7] = 1024.5
    with pytest.raises(CodecRangeError, match="index 7") as info:
        codec.encode(x)
    assert isinstance(info.value, ValueError)
    assert info.value.index == 7 and info.value.value == 1024.5
    x[7] = np.nan
    with pytest.raises(CodecRangeError, match="index 7"):
        codec.encode(x)
    with pytest.raises(CodecRangeError):
        codec.encode(x, clip=True)  # NaN is never clipped
    x[7] = -np.inf
    with pytest.raises(CodecRangeError):
        codec.encode(x)
    x[7] = -5000.0
    clipped = codec.decode(codec.encode(x, clip=True))
    assert clipped[7] == -1024.0


def test_encode_is_round_to_nearest():
    codec = FixedPointCodec(CodecParams(mod_bits=32, frac_bits=2, clip=100.0, max_clients=2))
    x = np.array([0.1, 0.13, -0.13, 0.375, -99.9])
    np.testing.assert_array_equal(codec.decode(codec.encode(x)), [0.0, 0.25, -0.25, 0.5, -100.0])


# ---------------------------------------------------------------- masking
def test_mask_sign():
    assert mask_sign(1, 2) == 1 and mask_sign(2, 1) == -1
    with pytest.raises(ValueError):
        mask_sign(3, 3)


@pytest.mark.parametrize("bits", [64, 32, 20])
def test_pairwise_masks_cancel_in_the_sum(bits):
    ids = [5, U64, 0, 2**63, 77]
    kps = {i: KeyPair.generate() for i in ids}
    seeds = {i: {j: pair_seed(kps[i], kps[j].public_bytes, 3, i, j) for j in ids if j != i} for i in ids}
    length = 4097
    dtype = np.dtype("<u4") if bits <= 32 else np.dtype("<u8")
    total = np.zeros(length, dtype=dtype)
    for i in ids:
        r = pairwise_mask_sum(i, seeds[i], [j for j in ids if j != i], 11, length, bits)
        assert r.any()
        total = total + r
    reduce_mod(total, bits)
    assert not total.any()
    # add then remove is the identity
    w = np.arange(length, dtype=dtype)
    reduce_mod(w, bits)
    orig = w.copy()
    add_pairwise_masks(w, 5, seeds[5], [0, 77], 11, bits)
    assert not np.array_equal(w, orig)
    add_pairwise_masks(w, 5, seeds[5], [0, 77], 11, bits, sign=-1)
    np.testing.assert_array_equal(w, orig)
