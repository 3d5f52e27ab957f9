"""The round announcement: masks bound to its digest (the same with or without the directory fields, a
per-context AES-256 key, reveals after a restart), and an unusable weight scale refused before training."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from client.secagg import (
    ENROLL_TYPE,
    RECORD,
    REVEAL_TYPE,
    VECTOR,
    SecureAggregationRefused,
    announcement_digest,
    as_bytes,
    directory_digest,
    directory_fields,
    from_u64b,
    handle_enroll,
    handle_reveal,
    ids_bytes,
    mask_reveal_from_content,
    masked_update_from_content,
    reveal_request_to_content,
    secagg_params,
    secure_train,
    u64b,
)
from common.secagg import EnrollRequest, SecAggServer
from common.secagg.prf import round_key

CFG = {"secagg-bits": 32, "secagg-clip": 1.0, "num-clients": 3, "secagg-min-survivors": 2}
RUN = 4242
NODES = (21, 22, 23)


@pytest.fixture
def fed():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    params = secagg_params(CFG)
    server = SecAggServer(RUN, params)
    contexts = {}
    for node in NODES:
        ctx = Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})
        ask = RecordDict({RECORD: ConfigRecord({"run": u64b(RUN), "params": params.fingerprint()})})
        cfg = handle_enroll(Message(ask, dst_node_id=node, message_type=ENROLL_TYPE), ctx, CFG, 100).content[RECORD]
        server.enroll(EnrollRequest(from_u64b(cfg["run"]), from_u64b(cfg["node"]), as_bytes(cfg["public-key"])))
        contexts[node] = ctx
    return contexts, server


def _announce(directory, round_, selected, weight_scale=100.0, *, with_directory=True):
    cfg = {"run": u64b(RUN), "round": u64b(round_), "selected": ids_bytes(selected),
           "weight-scale": float(weight_scale), "unit-records": "", "directory-digest": directory_digest(directory)}
    if with_directory:
        cfg.update(directory_fields(directory))
    return cfg


def _train(cfg, node):
    model = ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})
    return Message(RecordDict({"arrays": model, RECORD: ConfigRecord(dict(cfg))}), dst_node_id=node,
                   message_type=MessageType.TRAIN)


def _rule(update, calls=None):
    def rule(client, instruction, state):
        if calls is not None:
            calls.append(1)  # stands for local DP training and its ledger charge
        return RecordDict({"arrays": ArrayRecord({"w": Array(np.asarray(update, dtype=np.float32))}),
                           "metrics": MetricRecord({"num-examples": 100, "train-loss": 0.25})})
    return rule


@pytest.mark.parametrize("scale", [0.0, -5.0, math.nan, math.inf])
def test_unusable_weight_scale_is_refused_before_training(fed, scale):
    """A weight scale encode_reply cannot use (or that weighs the node to zero) is known before training:
    the node must refuse it then, not after the rule has charged its privacy ledger."""
    contexts, server = fed
    calls: list[int] = []
    server.start_round(1, NODES)
    msg = _train(_announce(server.directory(), 1, NODES, weight_scale=scale), 21)
    with pytest.raises(SecureAggregationRefused):
        secure_train(_rule([0.0, 0.1, 0.0, 0.0], calls), SimpleNamespace(config=CFG), msg, contexts[21])
    assert calls == [], "the node trained for an announcement it could not use"


def test_digest_is_the_same_with_or_without_the_directory_fields():
    base = {"run": u64b(1), "round": u64b(2), "selected": ids_bytes([1, 2]), "weight-scale": 100.0,
            "unit-records": "", "directory-digest": b"\x07" * 32}
    full = {**base, "server-key": b"\x01" * 32, "directory-nodes": ids_bytes([1, 2]), "directory-keys": b"\x02" * 64}
    assert announcement_digest(base) == announcement_digest(full)
    assert announcement_digest({**base, "weight-scale": 100}) == announcement_digest(base)  # int vs float


def test_round_key_is_an_aes256_key_distinct_per_context():
    seed = bytes(range(32))
    a, b = round_key(seed, b"\x00" * 32), round_key(seed, b"\x01" * 32)
    assert len(a) == len(b) == 32 and a != b and seed not in (a, b)
    assert round_key(seed) == seed


def test_reveal_after_restart_removes_the_announcement_bound_masks(fed):
    """Round 2: node 21 gets the directory again, 22 only the digest, 23 never replies. The survivors'
    reveals come from ClientApp processes that reload Context.state (as in Flower's deployment runtime);
    the decoded sum must be the survivors' exact sum."""
    contexts, server = fed
    client = SimpleNamespace(config=CFG)
    ups = {21: [0.5, -0.25, 0.0, 0.125], 22: [0.0, 0.25, -0.5, 0.0625]}
    # round 1: everyone, to get the directory out
    server.start_round(1, NODES)
    d = server.directory()
    for n in NODES:
        reply = secure_train(_rule([0.0] * 4), client, _train(_announce(d, 1, NODES), n), contexts[n])
        server.receive(masked_update_from_content(reply.content))
    server.result()
    # round 2
    server.start_round(2, NODES)
    for n, with_dir in ((21, True), (22, False)):
        reply = secure_train(_rule(ups[n]), client, _train(_announce(d, 2, NODES, with_directory=with_dir), n),
                             contexts[n])
        assert VECTOR in reply.content
        server.receive(masked_update_from_content(reply.content))
    request = server.declare_dropped()
    assert request is not None and request.dropped == (23,)
    for n in (21, 22):
        restarted = Context(run_id=1, node_id=n, node_config={}, state=copy.deepcopy(contexts[n].state),
                            run_config={})
        ask = Message(reveal_request_to_content(request), dst_node_id=n, message_type=REVEAL_TYPE)
        server.receive_reveal(mask_reveal_from_content(handle_reveal(ask, restarted, CFG).content))
    res = server.result()
    expected = sum(np.asarray(ups[n], dtype=np.float32).astype(np.float64) for n in (21, 22))
    np.testing.assert_allclose(res.weighted_sum, expected, atol=1e-4)  # w = 100 / 100 = 1
    assert res.total_weight == pytest.approx(2.0, abs=1e-4)
