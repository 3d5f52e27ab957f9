"""A secure-aggregation node never lets unmasked data out in an error reply, and refuses an unusable
round announcement before it trains (a refused round spends no privacy budget)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from client.secagg import (
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

CFG = {"secagg-bits": 32, "secagg-clip": 1.0, "num-clients": 3, "secagg-min-survivors": 2}
RUN = 99
NODES = (11, 12, 13)


@pytest.fixture
def federation():
    """Three enrolled nodes (Context.state as in Flower) and the server's directory."""
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
    return contexts, server.directory()


def train_message(directory, node, round_=1, selected=NODES, weight_scale=100.0):
    model = ArrayRecord({"w": Array(np.zeros(4, dtype=np.float32))})
    cfg = ConfigRecord({"run": u64b(RUN), "round": u64b(round_), "selected": ids_bytes(selected),
                        "weight-scale": float(weight_scale), "unit-records": "",
                        "directory-digest": directory_digest(directory), **directory_fields(directory)})
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
    contexts, directory = federation
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
    contexts, directory = federation
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
    from client.secagg import announcement_digest, ids_bytes, u64b

    base = {"run": u64b(7), "round": u64b(3), "selected": ids_bytes([1, 2, 3]), "weight-scale": 120.0,
            "unit-records": "control-delta", "directory-digest": b"\x01" * 32}
    changed = [{"run": u64b(8)}, {"round": u64b(4)}, {"selected": ids_bytes([1, 2])}, {"weight-scale": 1e12},
               {"unit-records": ""}, {"unit-records": "arrays"}, {"directory-digest": b"\x02" * 32}]
    digests = {announcement_digest(base)} | {announcement_digest({**base, **c}) for c in changed}
    assert len(digests) == 1 + len(changed)
    assert announcement_digest(dict(reversed(list(base.items())))) == announcement_digest(base)  # key order
