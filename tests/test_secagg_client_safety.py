"""A secure-aggregation node and its round announcements: no unmasked data in an error reply; an unusable
announcement refused before training (a refused round spends no privacy budget); masks bound to the
announcement's digest, which is the same with or without the directory fields; reveals after a restart."""

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
    REVEAL_TYPE,
    SecureAggregationRefused,
    announcement_digest,
    handle_reveal,
    mask_reveal_from_content,
    masked_update_from_content,
    reveal_request_to_content,
    ENROLL_TYPE,
    RECORD,
    VECTOR,
    as_bytes,
    directory_digest,
    directory_fields,
    from_u64b,
    handle_enroll,
    ids_bytes,
    secagg_params,
    secure_train,
    u64b,
)
from common.secagg import EnrollRequest, NotEnrolledError, RefusedError, SecAggServer
from common.secagg.prf import round_key

CFG = {"secagg-bits": 32, "secagg-clip": 1.0, "num-clients": 3, "fraction-train": 1.0, "secagg-min-survivors": 2}
RUN = 99
NODES = (11, 12, 13)


@pytest.fixture
def federation():
    """Three enrolled nodes (Context.state as in Flower) and the server."""
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


def announcement(directory, round_=1, selected=NODES, weight_scale=100.0, *, with_directory=True) -> dict:
    cfg = {"run": u64b(RUN), "round": u64b(round_), "selected": ids_bytes(selected),
           "weight-scale": float(weight_scale), "unit-records": "", "directory-digest": directory_digest(directory)}
    return {**cfg, **directory_fields(directory)} if with_directory else cfg


def train_message(directory, node, round_=1, selected=NODES, weight_scale=100.0, *, with_directory=True):
    model = ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})
    cfg = ConfigRecord(announcement(directory, round_, selected, weight_scale, with_directory=with_directory))
    return Message(RecordDict({"arrays": model, RECORD: cfg}), dst_node_id=node, message_type=MessageType.TRAIN)


def rule_returning(update, loss=0.5, calls=None):
    def rule(client, instruction, state):
        if calls is not None:
            calls.append(1)  # stands for the local training and its privacy-ledger charge
        return RecordDict({"arrays": ArrayRecord({"w": Array(np.asarray(update, dtype=np.float32))}),
                           "metrics": MetricRecord({"num-examples": 100, "train-loss": loss})})
    return rule


@pytest.mark.parametrize("case", ["update out of range", "metric out of range", "server shrinks the weight scale"])
def test_out_of_range_reply_carries_no_unmasked_value(federation, case):
    """A reply that cannot be encoded says so without the offending value: that value is the node's
    unmasked update coordinate (or metric), which the server must never see. The server can even force
    the failure (a tiny weight scale makes w = n / scale huge) to read the first nonzero coordinate."""
    contexts, server = federation
    directory = server.directory()
    secret, loss, scale = [0.0, 0.123456789, 0.0, 0.0], 0.5, 100.0
    if case == "update out of range":
        secret[1] = 123.456789
    elif case == "metric out of range":
        loss = 4242.4242
    else:
        scale = 1e-6
    reply = secure_train(rule_returning(secret, loss), SimpleNamespace(config=CFG),
                         train_message(directory, 11, weight_scale=scale), contexts[11])
    assert VECTOR not in reply.content
    reason = str(reply.content[RECORD]["error"])
    assert "outside the secure-aggregation codec" in reason
    for leaked in ("123.45", "0.12345", "4242.42", "update[", "weight ="):
        assert leaked not in reason, reason


@pytest.mark.parametrize("case", ["replayed round", "node not selected", "too few selected", "unknown peer"])
def test_unusable_announcement_is_refused_before_training(federation, case):
    """An announcement the node will refuse to mask for must be refused before the local update rule
    runs: the rule charges the node's privacy ledger, and a refused round releases nothing."""
    contexts, server = federation
    directory = server.directory()
    calls: list[int] = []
    rule = rule_returning([0.0, 0.1, 0.0, 0.0], calls=calls)
    client = SimpleNamespace(config=CFG)
    reply = secure_train(rule, client, train_message(directory, 11), contexts[11])
    assert VECTOR in reply.content and len(calls) == 1
    bad = {"replayed round": dict(round_=1), "node not selected": dict(round_=2, selected=(12, 13)),
           "too few selected": dict(round_=2, selected=(11,)),
           "unknown peer": dict(round_=2, selected=(11, 12, 77))}[case]
    with pytest.raises((RefusedError, NotEnrolledError)):
        secure_train(rule, client, train_message(directory, 11, **bad), contexts[11])
    assert len(calls) == 1, "the node trained (and spent privacy budget) for an announcement it then refused"


def test_the_announcement_digest_covers_everything_announced_to_all():
    """The masks are bound to this digest (tests/test_secagg_protocol.py): each field a server could tell
    nodes differently changes it."""
    base = {"run": u64b(7), "round": u64b(3), "selected": ids_bytes([1, 2, 3]), "weight-scale": 120.0,
            "unit-records": "control-delta", "directory-digest": b"\x01" * 32}
    changed = [{"run": u64b(8)}, {"round": u64b(4)}, {"selected": ids_bytes([1, 2])}, {"weight-scale": 1e12},
               {"unit-records": ""}, {"unit-records": "arrays"}, {"directory-digest": b"\x02" * 32}]
    digests = {announcement_digest(base)} | {announcement_digest({**base, **c}) for c in changed}
    assert len(digests) == 1 + len(changed)
    assert announcement_digest(dict(reversed(list(base.items())))) == announcement_digest(base)  # key order


@pytest.mark.parametrize("scale", [0.0, -5.0, math.nan, math.inf])
def test_unusable_weight_scale_is_refused_before_training(federation, scale):
    """A weight scale encode_reply cannot use (or that weighs the node to zero) is known before training."""
    contexts, server = federation
    calls: list[int] = []
    msg = train_message(server.directory(), 11, weight_scale=scale)
    with pytest.raises(SecureAggregationRefused):
        secure_train(rule_returning([0.0, 0.1, 0.0, 0.0], calls=calls), SimpleNamespace(config=CFG), msg,
                     contexts[11])
    assert calls == [], "the node trained for an announcement it could not use"


def test_digest_is_the_same_with_or_without_the_directory_fields(federation):
    _, server = federation
    full, bare = announcement(server.directory()), announcement(server.directory(), with_directory=False)
    assert announcement_digest(full) == announcement_digest(bare)
    assert announcement_digest({**bare, "weight-scale": 100}) == announcement_digest(bare)  # int vs float


def test_round_key_is_an_aes256_key_distinct_per_context():
    seed = bytes(range(32))
    a, b = round_key(seed, b"\x00" * 32), round_key(seed, b"\x01" * 32)
    assert len(a) == len(b) == 32 and a != b and seed not in (a, b)
    assert round_key(seed) == seed


def test_reveal_after_restart_removes_the_announcement_bound_masks(federation):
    """Round 2: node 11 gets the directory again, 12 only the digest, 13 never replies. The survivors'
    reveals come from ClientApp processes that reload Context.state (as in Flower's deployment runtime);
    the decoded sum must be the survivors' exact sum."""
    contexts, server = federation
    client = SimpleNamespace(config=CFG)
    ups = {11: [0.5, -0.25, 0.0, 0.125], 12: [0.0, 0.25, -0.5, 0.0625]}
    server.start_round(1, NODES)  # round 1: everyone, to get the directory out
    d = server.directory()
    for n in NODES:
        reply = secure_train(rule_returning([0.0] * 4), client, train_message(d, n), contexts[n])
        server.receive(masked_update_from_content(reply.content))
    server.result()
    server.start_round(2, NODES)
    for n, with_dir in ((11, True), (12, False)):
        reply = secure_train(rule_returning(ups[n]), client,
                             train_message(d, n, round_=2, with_directory=with_dir), contexts[n])
        assert VECTOR in reply.content
        server.receive(masked_update_from_content(reply.content))
    request = server.declare_dropped()
    assert request is not None and request.dropped == (13,)
    for n in (11, 12):
        restarted = Context(run_id=1, node_id=n, node_config={}, state=copy.deepcopy(contexts[n].state),
                            run_config={})
        ask = Message(reveal_request_to_content(request), dst_node_id=n, message_type=REVEAL_TYPE)
        server.receive_reveal(mask_reveal_from_content(handle_reveal(ask, restarted, CFG).content))
    res = server.result()
    expected = sum(np.asarray(ups[n], dtype=np.float32).astype(np.float64) for n in (11, 12))
    np.testing.assert_allclose(res.weighted_sum, expected, atol=1e-4)  # w = 100 / 100 = 1
    assert res.total_weight == pytest.approx(2.0, abs=1e-4)
