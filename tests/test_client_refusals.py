"""A node facing a curious or hostile server: it refuses instructions that would weaken its guarantee or
exhaust it, charging nothing, and a run config cannot move its files out of its state directory."""

from uuid import uuid4

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from client.node import local_client
from client.secagg import RECORD
from common.config import ConfigError, validate
from common.records import ARRAYS, CONFIG, model_to_arrays
from server.inprocess_grid import deliver, load_client_app

SMALL = {"dataset": "synthetic", "num-clients": 2, "synthetic-dim": 5, "synthetic-classes": 3, "seed": 3}
HU = {"strategy": "dpfedavg-hu", "hu-sigma": 2.0, "hu-local-steps": 2, "batch-size": 8}


@pytest.fixture(scope="module")
def app():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 7
    return load_client_app("client.app:app")


def node(tmp_path, **run_config):
    config = {**SMALL, **run_config, "state-dir": str(tmp_path)}
    return Context(run_id=7, node_id=1234, node_config={"partition-id": 0, "num-partitions": 2}, state=RecordDict(),
                   run_config=config)


def send(app, context, content, message_type="train"):
    msg = Message(content, 1234, message_type, group_id="1")
    for key, value in (("_message_id", str(uuid4())), ("_run_id", 7), ("_src_node_id", 1)):
        msg.metadata.__dict__[key] = value
    return deliver(app, msg, context)


def instruction(context, **values):
    client = local_client(context)
    return RecordDict({ARRAYS: model_to_arrays(client.model), CONFIG: ConfigRecord({"server-round": 1, **values})})


def refused(reply, text):
    return reply.has_error() and text in reply.error.reason


@pytest.mark.parametrize("sigma,clip,text", [(0.0, 1.0, "hu-sigma > 0"), (2.0, 0.0, "hu-clip"),
                                             (2.0, 100.0, "hu-clip")])
def test_hu_refuses_no_noise_or_another_clipping_in_a_private_run(app, tmp_path, sigma, clip, text):
    """Fixed hu-sigma, no budget: the server turned the noise off, or the clipping (rho was charged as 0)."""
    context = node(tmp_path, **HU)
    reply = send(app, context, instruction(context, **{"hu-sigma": sigma, "hu-clip": clip, "hu-accountant":
                                                        "conservative", "hu-local-steps": 2}))
    assert refused(reply, text)
    assert local_client(context).ledger.entries == ()


def test_a_run_without_secure_aggregation_refuses_to_fake_it(app, tmp_path):
    """A masked train would have earned the /r credit while the server cancels a made-up peer's mask."""
    context = node(tmp_path, **HU, **{"hu-accountant": "paper"})
    enroll = RecordDict({RECORD: ConfigRecord({"run": (5).to_bytes(8, "big"), "params": b""})})
    assert refused(send(app, context, enroll, "query.secagg_enroll"), "secure-aggregation = false")
    masked = instruction(context, **{"hu-sigma": 2.0, "hu-clip": 1.0, "hu-accountant": "paper",
                                     "hu-local-steps": 2})
    masked[RECORD] = ConfigRecord({"run": (5).to_bytes(8, "big")})
    assert refused(send(app, context, masked), "secure-aggregation = false")
    assert local_client(context).ledger.entries == ()


def test_a_private_run_releases_no_client_side_evaluation(app, tmp_path):
    context = node(tmp_path, privacy="dpsgd", **{"local-steps": 2})
    reply = send(app, context, instruction(context), "evaluate")
    assert refused(reply, "no client-side evaluation")
    plain = node(tmp_path / "plain")
    assert not send(app, plain, instruction(plain), "evaluate").has_error()


@pytest.mark.parametrize("run,asked,text", [
    ({}, {"local-epochs": 10**12}, "local-epochs"),
    ({"privacy": "dpsgd", "local-steps": 2}, {"local-steps": 10**12}, "local-steps"),
    ({"privacy": "dpsgd", "local-steps": 2, "target-epsilon": 1.0, "accountant": "pld"}, {"local-steps": 10**7},
     "local-steps"),
    ({"strategy": "fedprox", "privacy": "objective", "target-epsilon": 5.0}, {"proximal-mu": 1e9}, "proximal-mu"),
])
def test_hostile_amounts_are_refused_before_any_work(app, tmp_path, run, asked, text):
    """10**12 steps would hang the node (or exhaust its memory in the PLD accountant); a server-chosen mu
    would change the epsilon objective perturbation is charged."""
    context = node(tmp_path, **run)
    reply = send(app, context, instruction(context, **asked))
    assert refused(reply, text)
    assert local_client(context).ledger.entries == ()


@pytest.mark.parametrize("name", ["/../../escaped", "..", "a/b", "a\\b"])
def test_run_name_is_one_folder_name(name):
    """run-name names the ledger's and the snapshots' folders under the node's state directory."""
    with pytest.raises(ConfigError, match="run-name"):
        validate({"run-name": name})
