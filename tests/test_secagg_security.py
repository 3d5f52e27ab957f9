"""What the server sees: masked vectors look uniform; no seed and no unmasked update ever reaches it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import stats

from common.secagg import CodecParams, FixedPointCodec, SecAggClient, SecAggParams, SecAggServer

RUN = 77
P_MIN = 1e-4  # loose: a fixed-seed test that still catches any structure in the masks


def federation(n, params, seed=0):
    rng = np.random.default_rng(seed)
    ids = sorted({int(x) for x in rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)})
    server = SecAggServer(RUN, params)
    clients = {i: SecAggClient(RUN, i, params) for i in ids}
    received = []  # every message the server receives
    for c in clients.values():
        req = c.enroll_request()
        received.append(req)
        server.enroll(req)
    for c in clients.values():
        c.on_directory(server.directory())
    return server, clients, received


@pytest.mark.parametrize(
    "params", [SecAggParams(CodecParams(), 2), SecAggParams(CodecParams.compact(), 2),
               SecAggParams(CodecParams(mod_bits=40, frac_bits=16, clip=100.0, max_clients=8), 2)],
    ids=["k64", "k32", "k40"],
)
@pytest.mark.parametrize("content", ["zeros", "constant", "ramp"])
def test_single_masked_vector_is_uniform(params, content):
    """Chi-square on the byte histogram and on the top 8 bits of one client's masked vector.

    The input is maximally structured (all zeros, a constant, a ramp); with one
    other selected peer the masked words must still be uniform in Z_(2^k).
    """
    server, clients, _ = federation(2, params)
    ids = sorted(clients)
    d = 200_000
    u = {"zeros": np.zeros(d), "constant": np.full(d, 0.5), "ramp": np.linspace(-1, 1, d)}[content]
    m = clients[ids[0]].masked_update(1, ids, u, 1.0).masked
    k = params.codec.mod_bits
    full_bytes = k // 8  # whole little-endian bytes inside the k bits
    byts = m.view(np.uint8).reshape(-1, m.dtype.itemsize)[:, :full_bytes].ravel()
    counts = np.bincount(byts, minlength=256)
    assert stats.chisquare(counts).pvalue > P_MIN
    top = (m >> m.dtype.type(k - 8)).astype(np.int64)
    counts = np.bincount(top, minlength=256)
    assert counts.size == 256
    assert stats.chisquare(counts).pvalue > P_MIN
    # and it is unrelated to the encoded input: the difference is the (uniform) mask
    enc = FixedPointCodec(params.codec).encode(np.append(u, 1.0))
    assert np.mean(m == enc) < 1e-3


def _to_bytes(obj) -> bytes:
    """Serialise a message dict the way any transport would: every field's raw bytes."""
    if isinstance(obj, dict):
        return b"".join(_to_bytes(k) + _to_bytes(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return b"".join(_to_bytes(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return obj.tobytes()
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj)
    if isinstance(obj, bool):
        return bytes([obj])
    if isinstance(obj, int):
        return obj.to_bytes(16, "big", signed=True)
    if isinstance(obj, str):
        return obj.encode()
    raise TypeError(type(obj))


def _windows(raw: bytes, width: int, stride: int) -> set[bytes]:
    return {raw[i:i + width] for i in range(0, len(raw) - width + 1, stride)}


@pytest.mark.parametrize("params", [SecAggParams(CodecParams(), 3),
                                    SecAggParams(CodecParams.compact(), 3)], ids=["k64", "k32"])
def test_server_never_receives_a_seed_or_an_unmasked_update(params):
    """Run enrollment and rounds with dropouts; scan every received message's bytes."""
    n, d = 8, 400
    server, clients, received = federation(n, params, seed=1)
    ids = sorted(clients)
    rng = np.random.default_rng(2)
    codec = FixedPointCodec(params.codec)
    secrets: set[bytes] = set()
    forbidden: set[bytes] = set()
    for c in clients.values():
        secrets |= set(c._seeds.values())
        secrets.add(c._kp.private_bytes())
        secrets.add(c._mac_key)
    assert len(secrets) == n * (n - 1) // 2 + 2 * n

    for rnd, dropped in [(1, ()), (2, (ids[3],)), (3, (ids[0], ids[5], ids[7]))]:
        ann = server.start_round(rnd, ids)
        ups = {}
        for i in ids:
            u = rng.uniform(-1, 1, d).astype(np.float32)
            w = float(rng.uniform(1, 100))
            x = np.append(w * u.astype(np.float64), w)
            ups[i] = (u, w)
            # every representation of the client's unmasked data, in 8-byte windows
            forbidden |= _windows(u.tobytes(), 8, 4)
            forbidden |= _windows(u.astype(np.float64).tobytes(), 8, 8)
            forbidden |= _windows(x.tobytes(), 8, 8)
            forbidden |= _windows(codec.encode(x).tobytes(), 8, 4)
        for i in ids:
            msg = clients[i].masked_update(rnd, ann.selected, *ups[i])
            if i in dropped:
                continue  # never arrives
            received.append(msg)
            server.receive(msg)
        req = server.declare_dropped()
        if dropped:
            for i in req.survivors:
                rev = clients[i].reveal_masks(req)
                received.append(rev)
                server.receive_reveal(rev)
        res = server.result()
        assert res.survivors == tuple(i for i in ids if i not in dropped)

    assert len(received) == n + 8 + 7 + 5 + 7 + 5
    blobs = [_to_bytes(m.to_dict()) for m in received] + [pickle.dumps(m) for m in received]
    for blob in blobs:
        for s in secrets:
            assert s not in blob
            assert s[:16] not in blob and s[16:] not in blob
        wins = _windows(blob, 8, 1)
        assert not (wins & forbidden), "an unmasked value reached the server"
