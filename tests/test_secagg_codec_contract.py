"""The secure-aggregation codec's documented accuracy and its bound's smallest legal value (review of session
17: both failed before)."""

from __future__ import annotations

import numpy as np
import pytest

from client.secagg import secagg_params
from common.config import ConfigError, validate
from common.secagg import CodecParams, CodecRangeError, SecAggParams
from tests.test_secagg_protocol import federation


def test_weighted_mean_is_within_the_documented_bound():
    """codec.py: each weight is rounded to the codec's step 2^-f before it multiplies the update, so W decodes
    exactly and the mean is the weighted mean with those weights, within the sum bound / W. The weight slot
    used to be quantised on its own, apart from the w in w * u: ten clients, all u = 512, w = 1 + 7 * 2^-20
    (w * 2^16 has fraction 0.4375) gave a mean off by 3.4e-3, the documented bound 7.6e-6."""
    params = SecAggParams(CodecParams.compact(clip=1024.0, max_clients=16), min_survivors=2)
    step = 1.0 / params.codec.scale
    server, clients = federation(10, params)
    ids = sorted(clients)
    rng = np.random.default_rng(0)
    weights = {i: (1 + 7 * 2.0**-20 if k % 2 else float(rng.uniform(0.1, 1.0))) for k, i in enumerate(ids)}
    updates = {i: rng.uniform(-512, 512, 100) for i in ids}
    updates[ids[0]] = np.full(100, 512.0)
    server.start_round(1, ids)
    for i in ids:
        server.receive(clients[i].masked_update(1, ids, updates[i], weights[i]))
    res = server.result()
    w_q = {i: round(w / step) * step for i, w in weights.items()}
    exact_sum = sum(w_q[i] * updates[i] for i in ids)
    total = sum(w_q.values())
    assert res.total_weight == total  # exact: the weights are on the codec's grid
    bound_sum = params.codec.sum_error_bound(10, float(np.abs(exact_sum).max()))
    assert np.abs(res.weighted_sum - exact_sum).max() <= bound_sum
    err = float(np.abs(res.weighted_mean() - exact_sum / total).max())
    assert err <= bound_sum / total, f"weighted mean off by {err:.3g}, documented bound {bound_sum / total:.3g}"


def test_codec_bound_below_one_still_admits_the_largest_client():
    """`secagg-clip` is documented as the bound on |w_i * (local - global)| and |w_i * metric|, with
    w_i = examples / largest enrolled examples <= 1, and any value > 0 is accepted. But the weight slot
    w_i itself is encoded under the same bound: with secagg-clip < 1 the largest client (w = 1) can never
    encode its reply and is dropped in every round (with equal-size clients, as in Hu et al.'s
    16 x 3052 devices, every client is: every round aborts). Either the config must refuse
    secagg-clip < 1, or a client with w = 1 and a tiny update must encode."""
    try:
        config = validate({"num-clients": 4, "dataset": "synthetic", "secure-aggregation": True,
                           "secagg-clip": 0.5})
    except ConfigError:
        return  # refused up front: fine
    params = secagg_params(config)
    _, clients = federation(4, params)
    ids = sorted(clients)
    delta = np.full(50, 1e-3)  # far inside the bound
    try:
        clients[ids[0]].masked_update(1, ids, delta, 1.0)  # the largest client: w = n_i / max n = 1
    except CodecRangeError as exc:
        pytest.fail(f"a tiny update of the largest client cannot be encoded under secagg-clip = 0.5: {exc}")


def test_codec_headroom_is_sized_for_the_clients_a_round_selects():
    """The codec needs headroom for the sum of the selected clients, not of every client: with 3550 clients
    and 10 % per round, sizing for 3550 gave a step of 2^-9 (2e-3) on 32-bit words where 355 allow 2^-12.
    Both sides refuse a larger selected set, so the finer step is safe."""
    config = validate({"num-clients": 3550, "fraction-train": 0.1, "dataset": "synthetic",
                       "secure-aggregation": True})
    codec = secagg_params(config).codec
    assert codec.max_clients == 355
    assert codec == CodecParams.fit(32, 1024.0, 355)
    assert codec.frac_bits == 12


def test_config_headroom_check_counts_the_clients_per_round():
    """A clip that fits the clients a round selects is accepted; one that does not is refused up front."""
    base = {"num-clients": 3000, "dataset": "synthetic", "secure-aggregation": True, "secagg-clip": 2.0**21}
    validate({**base, "fraction-train": 0.1})  # 300 * 2^21 < 2^31
    with pytest.raises(ConfigError, match="clients per round"):
        validate({**base, "fraction-train": 1.0})


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_a_unit_weight_sum_is_exact_for_unequal_partitions():
    """A unit-weight record (Hu et al.'s and FedDyn's models, SCAFFOLD's control-delta) was divided by the exact
    w_i = n_i / n_max, then multiplied by w_i on the codec's grid: a small client's entered the sum scaled by
    rint(w_i 2^f) / (w_i 2^f) (measured: off by 5.5e-4, bound 7.6e-6)."""
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

    from client.secagg import encode_reply
    from common.secagg import SecAggClient, SecAggServer

    RUN = 0x1234
    params = SecAggParams(CodecParams.fit(32, 1024.0, 10), min_survivors=2)  # the README's example: f = 17
    server = SecAggServer(RUN, params)
    clients = {i: SecAggClient(RUN, i, params) for i in (11, 22)}
    for c in clients.values():
        server.enroll(c.enroll_request())
    directory = server.directory()
    for c in clients.values():
        c.on_directory(directory)

    n = {11: 1000, 22: 5}  # unequal partitions; weight scale = n_max
    global_model = np.zeros(4, np.float32)
    models = {11: np.full(4, 0.5, np.float32), 22: np.full(4, 1.0, np.float32)}
    instruction = RecordDict({"arrays": ArrayRecord({"w": Array(global_model)})})
    ann = server.start_round(1, sorted(clients))
    for i, c in clients.items():
        reply = RecordDict({"arrays": ArrayRecord({"w": Array(models[i])}),
                            "metrics": MetricRecord({"num-examples": n[i]})})
        vector, w, metrics, layout = encode_reply(reply, instruction, {"arrays"}, float(max(n.values())), params.codec.scale)
        server.receive(c.masked_update(1, ann.selected, vector, w, metrics, layout=layout))
    result = server.result()
    decoded = np.asarray(result.weighted_sum[:4], np.float64)  # sum_i u_i of the unit-weight record
    exact = sum(models[i].astype(np.float64) - global_model for i in clients)
    error = float(np.max(np.abs(decoded - exact)))
    bound = params.codec.sum_error_bound(2)
    assert error <= bound, f"unit-weight sum off by {error:.3g} (bound {bound:.3g}): decoded {decoded}, exact {exact}"
