"""Enrollment (server/roster.py): a malformed or hostile entry stops the run with a FederationError
naming the node and the field, never a bare library error and never a silently enrolled partition."""

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

import client.app
import client.node
from common.config import validate
from server.inprocess_grid import InProcessGrid
from server.roster import FederationError, enroll
from server.runner import run_federation

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
GOOD = {101: {"partition-id": 0, "num-examples": 10}, 102: {"partition-id": 1, "num-examples": 30}}


class FakeGrid:
    """Each node replies with its `infos` entry as the config record (None: no config record)."""

    def __init__(self, infos):
        self.infos = infos

    def get_node_ids(self):
        return list(self.infos)

    def send_and_receive(self, msgs, timeout=None):
        out = []
        for m in msgs:
            info = self.infos[m.metadata.dst_node_id]
            content = RecordDict({"config": ConfigRecord(info)} if info is not None else {})
            reply = Message(content, reply_to=m)
            reply.metadata.__dict__["_src_node_id"] = m.metadata.dst_node_id  # as the grid would set it
            out.append(reply)
        return out


def enroll_with(extra, **sizes):
    return enroll(FakeGrid({**GOOD, **extra}), 3, 1.0, lambda *_: None, **sizes)


def test_clean_enrollment():
    roster = enroll_with({103: {"partition-id": 2, "num-examples": 60}}, sizes=[10, 30, 60])
    assert roster.node_of == {0: 101, 1: 102, 2: 103} and roster.num_examples == {0: 10, 1: 30, 2: 60}


@pytest.mark.parametrize("extra,match", [
    ({103: {"partition-id": 2, "num-examples": -5}}, "node 103: num-examples -5 must be positive"),
    ({103: {"partition-id": 2, "num-examples": 0}}, "node 103: num-examples 0 must be positive"),
    ({103: {"partition-id": 2, "num-examples": float("inf")}}, "node 103: .*'num-examples' must be an int"),
    ({103: {"partition-id": 2, "num-examples": "abc"}}, "node 103: .*'num-examples' must be an int"),
    ({103: {"partition-id": 2, "num-examples": True}}, "node 103: .*'num-examples' must be an int"),
    ({103: {"partition-id": 2}}, "node 103: enrollment reply lacks 'num-examples'"),
    ({103: {"partition-id": 2.7, "num-examples": 5}}, "node 103: .*'partition-id' must be an int"),
    ({103: None}, "node 103: enrollment reply has no 'config' record"),
    ({103: {"partition-id": 2, "num-examples": 60}, 104: {"partition-id": 99, "num-examples": 7}},
     "node 104: partition-id 99 is outside 0..2"),
    ({103: {"partition-id": 2, "num-examples": 60}, 104: {"partition-id": -1, "num-examples": 7}},
     "node 104: partition-id -1 is outside 0..2"),
])
def test_bad_entries_stop_the_run_naming_node_and_field(extra, match):
    with pytest.raises(FederationError, match=match):
        enroll_with(extra)


def test_num_examples_is_capped_by_the_partition_size():
    """A node claiming more data than its partition holds would outweigh every other reply."""
    with pytest.raises(FederationError, match="node 103: num-examples 1000000000000000 exceeds partition 2's 60"):
        enroll_with({103: {"partition-id": 2, "num-examples": 10**15}}, sizes=[10, 30, 60])


def test_runner_caps_num_examples_by_the_federation(tmp_path, monkeypatch):
    """run_federation passes the federation's partition sizes: a node overstating its size is refused."""
    real = client.app.local_client

    def overstating(context):
        node = real(context)
        if node.partition == 1:
            node.num_train = 10**15
        return node

    monkeypatch.setattr(client.app, "local_client", overstating)
    cfg = validate({"num-clients": 3, "num-rounds": 1, "strategy": "fedavg", "dataset": "synthetic",
                    "results-dir": str(tmp_path / "results"), "run-name": "r"})
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), 3, run_id=1) as grid:
        with pytest.raises(FederationError, match="num-examples 1000000000000000 exceeds partition 1's"):
            run_federation(grid, cfg)
    client.node._local.clear()


def test_an_unavailable_node_is_named_not_the_superlink():
    """Flower's SuperLink answers for an unavailable node itself, with its own id as the source: the
    enrollment error names the node that was asked."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    class SuperLinkAnswers(FakeGrid):
        def send_and_receive(self, msgs, timeout=None):
            for i, m in enumerate(msgs):
                m.metadata.__dict__["_message_id"] = f"m{i}"  # as the grid's push sets it
            out = super().send_and_receive([m for m in msgs if m.metadata.dst_node_id != 103])
            gone = next(m for m in msgs if m.metadata.dst_node_id == 103)
            error = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node unavailable"), reply_to=gone)
            error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            return out + [error]

    with pytest.raises(FederationError, match="node 103: node unavailable"):
        enroll(SuperLinkAnswers({**GOOD, 103: {"partition-id": 2, "num-examples": 60}}), 3, 1.0, lambda *_: None)
