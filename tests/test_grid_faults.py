"""Bad ClientApp results, dead or hung worker processes, unreadable reply payloads and a
silent `flwr run` never crash or hang the server."""

import multiprocessing
import os
import time

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

import server.flower_run as flower_run
from server.inprocess_grid import InProcessGrid
from server.metered_grid import MeteredGrid

app = ClientApp()  # importable by worker processes as f"{__name__}:app"


@app.query("ok")
def ok(msg: Message, context) -> Message:
    return Message(RecordDict({"r": ConfigRecord({"partition": int(context.node_config["partition-id"])})}),
                   reply_to=msg)


@app.query("bad")
def bad(msg: Message, context) -> Message:
    """Partition 0 answers properly; the others return what Flower's SuperLink would never store."""
    partition = int(context.node_config["partition-id"])
    if partition == 0:
        return ok(msg, context)
    if partition == 1:
        return None
    if partition == 2:  # a reply to some other message
        other = Message(RecordDict(), dst_node_id=msg.metadata.dst_node_id, message_type="query.ok")
        return Message(RecordDict({"r": ConfigRecord({"partition": 2})}), reply_to=other)
    if partition == 3:  # not a reply at all
        return Message(RecordDict({"r": ConfigRecord({"partition": 3})}), dst_node_id=7, message_type="query.ok")
    reply = ok(msg, context)  # a reply claiming to come from another node
    reply.metadata.__dict__["_src_node_id"] = 12345
    return reply


@app.query("die")
def die(msg: Message, context) -> Message:
    if multiprocessing.parent_process() is None:
        raise RuntimeError("not in a worker process")
    os._exit(3)


@app.query("hang")
def hang(msg: Message, context) -> Message:
    time.sleep(float(msg.content["c"]["seconds"]))
    return Message(RecordDict(), reply_to=msg)


SPEC = f"{__name__}:app"


def ask(kind, nodes, content=None):
    return [Message(content or RecordDict(), dst_node_id=n, message_type=f"query.{kind}") for n in nodes]


def test_results_that_are_no_reply_to_the_message_are_dropped():
    with InProcessGrid(SPEC, {}, 5) as grid:
        nodes = list(grid.get_node_ids())
        messages = ask("bad", nodes)
        replies = list(grid.send_and_receive(messages, timeout=30))
        assert [r.content["r"]["partition"] for r in replies] == [0]
        assert replies[0].metadata.src_node_id == nodes[0]
        assert replies[0].metadata.reply_to_message_id == messages[0].metadata.message_id
        ids = list(grid.push_messages(ask("bad", nodes)))  # the push/pull path: nothing left behind
        assert [r.content["r"]["partition"] for r in grid.pull_messages(ids)] == [0]
        assert grid._replies == {}


def test_a_dead_worker_makes_its_nodes_unavailable_not_the_server_crash():
    with InProcessGrid(SPEC, {}, 4, workers=2) as grid:
        nodes = list(grid.get_node_ids())  # nodes 0 and 2 on worker 0, nodes 1 and 3 on worker 1
        (dead,) = grid.send_and_receive(ask("die", nodes[:1]), timeout=60)
        assert dead.has_error() and dead.metadata.src_node_id == nodes[0]
        replies = list(grid.send_and_receive(ask("ok", nodes), timeout=60))
        by_node = {r.metadata.src_node_id: r for r in replies}
        assert set(by_node) == set(nodes)
        assert [by_node[n].error.code for n in (nodes[0], nodes[2])] == [ErrorCode.NODE_UNAVAILABLE] * 2
        assert [by_node[n].content["r"]["partition"] for n in (nodes[1], nodes[3])] == [1, 3]


def test_close_does_not_wait_for_a_client_past_its_deadline():
    grid = InProcessGrid(SPEC, {}, 2, workers=2)
    nodes = list(grid.get_node_ids())
    content = RecordDict({"c": ConfigRecord({"seconds": 60.0})})
    assert list(grid.send_and_receive(ask("hang", nodes[:1], content), timeout=0.5)) == []
    t0 = time.monotonic()
    grid.close()
    assert time.monotonic() - t0 < 10


class OneReplyGrid:
    """Answers every message with `content`."""

    def __init__(self, content):
        self.content = content

    def send_and_receive(self, messages, *, timeout=None):
        return [Message(self.content, reply_to=m) for m in messages]


def test_metering_survives_an_array_numpy_cannot_read():
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    arrays = ArrayRecord({"w": Array(dtype="bogus", shape=(3,), stype="numpy.ndarray", data=b"abcd")})
    grid = MeteredGrid(OneReplyGrid(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})})))
    msg = Message(RecordDict(), dst_node_id=5, message_type="train")
    msg.metadata.__dict__["_message_id"] = "m1"
    assert len(grid.send_and_receive([msg], timeout=1)) == 1
    assert grid.bytes_up == 4


def test_flower_run_timeout_holds_when_flwr_prints_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "flwr").write_text("#!/bin/sh\necho started\nsleep 60\necho finished\n")
    (fake / "flwr").chmod(0o755)
    real_env = flower_run.flower_env
    monkeypatch.setattr(flower_run, "flower_env",
                        lambda home: {**real_env(home), "PATH": f"{fake}{os.pathsep}{real_env(home)['PATH']}"})
    t0 = time.monotonic()
    code, output, results = flower_run.run_with_flower({}, 2, timeout=1.0)
    assert time.monotonic() - t0 < 15
    assert code != 0 and "finished" not in output and results is None
