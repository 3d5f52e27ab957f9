"""InProcessGrid: per-node contexts, persistent state, reply metadata, error
replies, timeouts, and workers = 2 giving the same results as workers = 1."""

import io
import json
import time

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from rich.console import Console

from common.config import validate
from server.inprocess import run_inprocess
from server.inprocess_grid import InProcessGrid

# A test ClientApp, importable by worker processes as f"{__name__}:app".
app = ClientApp()


@app.query("count")
def count(msg: Message, context) -> Message:
    record = context.state.get("counter")
    n = (int(record["n"]) if record is not None else 0) + 1
    context.state["counter"] = ConfigRecord({"n": n})
    reply = ConfigRecord({"n": n, "partition": int(context.node_config["partition-id"]),
                          "num-partitions": int(context.node_config["num-partitions"]),
                          "node": context.node_id, "tag": str(context.run_config["tag"])})
    return Message(RecordDict({"r": reply}), reply_to=msg)


@app.query("fail")
def fail(msg: Message, context) -> Message:
    raise ValueError("boom from the client")


@app.query("sleep")
def sleep(msg: Message, context) -> Message:
    time.sleep(float(msg.content["c"]["seconds"]))
    return Message(RecordDict({"r": ConfigRecord({"partition": int(context.node_config["partition-id"])})}),
                   reply_to=msg)


SPEC = f"{__name__}:app"
RUN_CONFIG = {"tag": "hello"}


def ask(grid, kind, nodes=None, content=None):
    nodes = list(grid.get_node_ids()) if nodes is None else nodes
    return [Message(content or RecordDict(), dst_node_id=n, message_type=f"query.{kind}") for n in nodes]


@pytest.fixture(scope="module")
def grid2():
    with InProcessGrid(SPEC, RUN_CONFIG, 3, workers=2) as grid:
        yield grid


def check_contexts_and_state(grid):
    nodes = list(grid.get_node_ids())
    assert len(nodes) == 3 and len(set(nodes)) == 3 and SUPERLINK_NODE_ID not in nodes
    for expected in (1, 2, 3):
        messages = ask(grid, "count")
        replies = list(grid.send_and_receive(messages, timeout=60))
        assert len(replies) == 3
        by_node = {r.metadata.src_node_id: r for r in replies}
        assert set(by_node) == set(nodes)
        for i, node in enumerate(nodes):
            reply, sent = by_node[node], next(m for m in messages if m.metadata.dst_node_id == node)
            info = reply.content["r"]
            assert info["n"] == expected  # Context.state persists across messages
            assert info["partition"] == i and info["num-partitions"] == 3
            assert info["node"] == node and info["tag"] == "hello"
            md = reply.metadata
            assert md.dst_node_id == SUPERLINK_NODE_ID
            assert md.reply_to_message_id == sent.metadata.message_id != ""
            assert md.message_id and md.message_id != sent.metadata.message_id
            assert md.message_type == "query.count" and md.run_id == grid.run


def test_contexts_state_and_metadata_sequential():
    with InProcessGrid(SPEC, RUN_CONFIG, 3) as grid:
        check_contexts_and_state(grid)


def test_contexts_state_and_metadata_workers(grid2):
    check_contexts_and_state(grid2)


def check_error_reply(grid):
    nodes = list(grid.get_node_ids())
    messages = ask(grid, "fail", nodes[:2])
    replies = list(grid.send_and_receive(messages, timeout=60))
    assert len(replies) == 2
    for reply in replies:
        assert reply.has_error() and not reply.has_content()
        assert reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
        assert "boom from the client" in reply.error.reason
        assert reply.metadata.src_node_id in nodes[:2]
        assert reply.metadata.reply_to_message_id in {m.metadata.message_id for m in messages}


def test_error_reply_sequential():
    with InProcessGrid(SPEC, RUN_CONFIG, 3) as grid:
        check_error_reply(grid)
        assert len(list(grid.send_and_receive(ask(grid, "count"), timeout=60))) == 3  # still serving


def test_error_reply_workers(grid2):
    check_error_reply(grid2)


def sleepy(grid, seconds):
    return [Message(RecordDict({"c": ConfigRecord({"seconds": s})}), dst_node_id=n, message_type="query.sleep")
            for n, s in zip(grid.get_node_ids(), seconds)]


def test_timeout_sequential():
    with InProcessGrid(SPEC, RUN_CONFIG, 3) as grid:
        t0 = time.perf_counter()
        replies = list(grid.send_and_receive(sleepy(grid, [0.0, 0.5, 0.0]), timeout=0.2))
        # node 0 answered in time; node 1 overran the deadline (dropped); node 2 was never started
        assert [r.content["r"]["partition"] for r in replies] == [0]
        assert time.perf_counter() - t0 < 0.5 + 0.4
        assert len(list(grid.send_and_receive(sleepy(grid, [0, 0, 0]), timeout=5))) == 3


def test_timeout_workers(grid2):
    # nodes 0 and 2 share worker 0; node 1 (worker 1) is slow and misses the deadline
    replies = list(grid2.send_and_receive(sleepy(grid2, [0.0, 1.0, 0.0]), timeout=0.5))
    assert sorted(r.content["r"]["partition"] for r in replies) == [0, 2]
    time.sleep(1.0)  # let the late client finish; its reply must not leak into the next round
    replies = list(grid2.send_and_receive(sleepy(grid2, [0, 0, 0]), timeout=30))
    assert sorted(r.content["r"]["partition"] for r in replies) == [0, 1, 2]


def test_push_pull_and_no_waiting():
    with InProcessGrid(SPEC, RUN_CONFIG, 10) as grid:
        messages = ask(grid, "count")
        ids = list(grid.push_messages(messages))
        assert len(set(ids)) == 10
        assert len(list(grid.pull_messages(ids))) == 10
        assert list(grid.pull_messages(ids)) == []  # each reply is delivered once
        t0 = time.perf_counter()
        for _ in range(20):
            grid.send_and_receive(ask(grid, "count"), timeout=10)
        assert (time.perf_counter() - t0) / 20 < 0.05  # no pollers, no sleeps (Flower's tick is 0.1 s)
        with pytest.raises(ValueError, match="unknown node"):
            grid.push_messages([Message(RecordDict(), dst_node_id=12345, message_type="query.count")])


def test_workers_2_same_results_as_workers_1(tmp_path):
    base = {"num-clients": 4, "num-rounds": 3, "seed": 5, "fraction-train": 0.5, "local-epochs": 2,
            "results-dir": str(tmp_path)}
    dirs = {w: run_inprocess(validate({**base, "run-name": f"w{w}"}), workers=w, console=Console(file=io.StringIO()))
            for w in (1, 2)}
    rows = {w: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for w, d in dirs.items()}
    for a, b in zip(rows[1], rows[2], strict=True):
        for key in ("round", "accuracy", "loss", "train_loss", "clients", "bytes_up", "bytes_down"):
            assert a[key] == b[key], key
    m1, m2 = np.load(dirs[1] / "model.npz"), np.load(dirs[2] / "model.npz")
    assert m1.files == m2.files
    for key in m1.files:
        np.testing.assert_array_equal(m1[key], m2[key])
