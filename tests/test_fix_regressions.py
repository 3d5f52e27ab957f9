"""Regressions that session 12's review fixes introduced and a review of that diff caught: an old pFedMe
checkpoint, `repro --seeds N` beyond a suite's seeds, and a CPU client touching CUDA."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from common.config import validate
from server.roster import Roster


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- 1. pFedMe: a checkpoint written before today's change no longer resumes ------------------------------
def test_pfedme_checkpoint_from_before_the_test_size_change_resumes_or_is_refused_at_load(tmp_path):
    """Before 7493705 PFedMe.personal was {partition: (accuracy, test examples)}; it is now
    {partition: accuracy} and the test sizes are a new attribute. The checkpoint format stayed at
    version 2 and load_auto_state only checks that `personal` is still a dict, so an old checkpoint
    loads: the first round after the resume in which not every partition trains then crashes the
    ServerApp in aggregate_train with "TypeError: unsupported operand type(s) for +: 'int' and
    'tuple'" (server/strategies/pfedme.py, the weighted mean over self.personal). A resumable run must
    either continue (old entries read as their accuracy) or be refused up front as a CheckpointError."""
    from common.checkpoint_file import CheckpointError, load_checkpoint, save_checkpoint
    from server.checkpoint import load_strategy_state, strategy_state
    from server.strategies.pfedme import PFedMe

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    roster = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})
    sizes = {0: 5, 1: 5, 2: 5}
    written = PFedMe(roster, seed=1, fraction_train=1 / 3, log=lambda _: None, test_sizes=sizes)
    state = strategy_state(written)
    state[0].pop("test_sizes")  # the attribute did not exist before 7493705
    state[0]["personal"] = {0: (0.8, 5), 1: (0.6, 5), 2: (0.7, 5)}  # the layout before 7493705
    path = tmp_path / "run.ckpt.npz"
    save_checkpoint(path, {"strategy": state})

    resumed = PFedMe(roster, seed=1, fraction_train=1 / 3, log=lambda _: None, test_sizes=sizes)
    try:
        load_strategy_state(resumed, load_checkpoint(path, "test")["strategy"])
    except CheckpointError:
        return  # refused at load, before any round: acceptable
    model = ArrayRecord({"w": Array(np.zeros((2, 3), np.float32))})
    replies = [Message(RecordDict({"arrays": model, "metrics": MetricRecord({"num-examples": 10,
                                                                            "personal-accuracy": 0.9})}),
                       reply_to=msg)
               for msg in resumed.configure_train(2, model, ConfigRecord(), None)]
    assert len(replies) == 1  # one partition of three trains: the other two keep their old entries
    _, metrics = resumed.aggregate_train(2, replies)
    assert 0.0 <= metrics["personal-accuracy"] <= 1.0, dict(metrics)


# --- 3. global_torch_rng touches CUDA for a client that trains on the CPU --------------------------------
def test_a_cpu_client_train_step_does_not_initialise_cuda(tmp_path, monkeypatch):
    """client/app.py `checked` now runs every rule inside common/seeding.py `global_torch_rng`, which
    forks the RNG of `torch.cuda.current_device()` whenever `torch.cuda.is_available()`, whatever
    device the client trains on: on a GPU host a client with device = "cpu" (an in-process worker, a
    SuperNode's ClientApp process) now creates a CUDA context (hundreds of MB of GPU memory and a
    start-up delay per process) for draws that all happen on the CPU; an exclusive-process GPU makes
    the second such process fail. Only the device the client uses should be forked.
    Simulated here: CUDA reported available, and any call that would initialise it is recorded."""
    import client.node
    from client.node import local_client
    from common.records import ARRAYS, CONFIG, model_to_arrays
    from server.inprocess_grid import deliver, load_client_app
    from server.runner import initial_model

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 7
    client.node._local.clear()
    config = dict(validate({"num-clients": 3, "num-rounds": 1, "seed": 3, "dataset": "synthetic",
                            "device": "cpu", "state-dir": str(tmp_path / "state"), "results-dir": str(tmp_path)}))
    context = Context(run_id=7, node_id=1000, node_config={"partition-id": 0, "num-partitions": 3},
                      state=RecordDict(), run_config=config)
    content = RecordDict({ARRAYS: model_to_arrays(initial_model(local_client(context).config)),
                          CONFIG: ConfigRecord({"server-round": 1, "train-round": 1})})

    touched = []

    def no_cuda(*args, **kwargs):
        touched.append("torch.cuda.current_device")
        raise RuntimeError("a CPU client initialised CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", no_cuda)

    from uuid import uuid4

    msg = Message(content, context.node_id, "train", group_id="1")
    for key, value in (("_message_id", str(uuid4())), ("_run_id", 7), ("_src_node_id", SUPERLINK_NODE_ID)):
        msg.metadata.__dict__[key] = value
    reply = deliver(load_client_app("client.app:app"), msg, context)
    assert not touched, touched
    assert not reply.has_error(), reply.error.reason
