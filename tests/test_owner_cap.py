"""The data owner's own cap on epsilon (node config `max-epsilon`, client/node.py): the node's budget is the
smaller of it and the run's, and such a node refuses a run without a privacy mechanism (DESIGN principle 3)."""

from uuid import uuid4

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

import client.node
from client.node import NodeSetupError, local_client, node_run_config
from client.privacy import ledger_path
from common.config import validate
from common.privacy.ledger import PrivacyLedger
from common.records import ARRAYS, CONFIG, model_to_arrays
from server.inprocess_grid import InProcessGrid, deliver, load_client_app
from server.runner import run_federation

DPSGD = {"dataset": "synthetic", "num-clients": 3, "num-rounds": 5, "privacy": "dpsgd", "local-steps": 3,
         "dp-sample-rate": 0.1, "target-epsilon": 3.2}


def context(run_config, **node):
    return Context(run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 3, **node},
                   state=RecordDict(), run_config=run_config)


@pytest.mark.parametrize("run_target, cap, budget", [(3.2, 1.0, 1.0), (0.5, 1.0, 0.5), (0.0, 1.0, 1.0)])
def test_the_budget_is_the_smaller_of_the_run_and_the_owner(run_target, cap, budget):
    assert node_run_config(context({**DPSGD, "target-epsilon": run_target}, **{"max-epsilon": cap})
                           )["target-epsilon"] == budget


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), "2", True])
def test_a_cap_that_is_not_a_positive_number_is_a_node_setup_error(cap):
    with pytest.raises(NodeSetupError, match="max-epsilon"):
        node_run_config(context(DPSGD, **{"max-epsilon": cap}))


def run(cfg, caps, tmp_path):
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), 3, run_id=1) as grid:
        for node, cap in zip(grid.node_ids, caps):
            if cap is not None:
                grid.contexts[node].node_config["max-epsilon"] = cap
        return run_federation(grid, cfg)


@pytest.mark.timeout(120)
def test_a_capped_node_stops_at_its_owners_cap_the_others_at_the_runs(tmp_path, one_torch_thread):
    cfg = validate({**DPSGD, "results-dir": str(tmp_path), "state-dir": str(tmp_path / "state")})
    run(cfg, [1.0, None, None], tmp_path)
    eps = [PrivacyLedger.load(ledger_path(cfg, {}, 1, p)).epsilon(1e-5) for p in range(3)]
    assert eps[0] <= 1.0 < min(eps[1:]) <= 3.2, eps


@pytest.mark.timeout(120)
def test_a_capped_node_refuses_a_run_without_a_privacy_mechanism(tmp_path, one_torch_thread):
    cfg = validate({"dataset": "synthetic", "num-clients": 3, "num-rounds": 1, "results-dir": str(tmp_path)})
    with pytest.raises(RuntimeError, match="max-epsilon"):
        run(cfg, [1.0, 1.0, 1.0], tmp_path)


# --- what else a capped node refuses (review of session 19): the run config is the server's ---------------
@pytest.fixture(scope="module")
def app():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 7
    return load_client_app("client.app:app")


def send(app, tmp_path, message_type="train", **run_config):
    """One message from the server to a node capped at max-epsilon = 1: (its reply, its ledger entries)."""
    ctx = Context(run_id=7, node_id=1234, state=RecordDict(), node_config={"partition-id": 0, "num-partitions": 2,
                                                                           "max-epsilon": 1.0},
                  run_config={"dataset": "synthetic", "num-clients": 2, "synthetic-dim": 5, "seed": 3,
                              "state-dir": str(tmp_path), **run_config})
    content = RecordDict({ARRAYS: model_to_arrays(local_client(ctx).model),
                          CONFIG: ConfigRecord({"server-round": 1, "local-steps": 2})})
    msg = Message(content, 1234, message_type, group_id="1")
    for key, value in (("_message_id", str(uuid4())), ("_run_id", 7), ("_src_node_id", 1)):
        msg.metadata.__dict__[key] = value
    return deliver(app, msg, ctx), local_client(ctx).ledger.entries


def test_a_capped_node_releases_no_client_side_evaluation(app, tmp_path):
    """In a run without a privacy mechanism it refused to train, yet answered `evaluate` with the exact loss
    and accuracy of its test records on any model the server chose."""
    reply, _ = send(app, tmp_path, "evaluate")
    assert reply.has_error() and "max-epsilon" in reply.error.reason


@pytest.mark.parametrize("run", [
    {"privacy": "dpsgd", "local-steps": 2, "dp-noise-seed": "run-seed"},  # the server can regenerate the noise
    {"privacy": "output", "output-sensitivity": "paper", "output-clip": 1.0, "output-noise-std": 1.0},
    {"strategy": "ali-dpfl", "privacy": "dpsgd", "ali-mu-estimator": "paper"},  # noise-free
    {"privacy": "dpsgd", "local-steps": 2, "target-delta": 0.5},  # the run picks the delta of the cap
], ids=["run-seed-noise", "output-sensitivity-paper", "ali-mu-estimator-paper", "delta-at-least-1-over-n"])
def test_a_capped_node_refuses_an_epsilon_that_is_no_guarantee_against_the_server(app, tmp_path, run):
    """Each of these was charged within the cap and released: e.g. output-sensitivity = 'paper' charged
    epsilon 0.0015 for a release that costs 10.7 under the clip's real sensitivity ('ball')."""
    reply, entries = send(app, tmp_path, **{"target-epsilon": 5.0, **run})
    assert reply.has_error() and "max-epsilon" in reply.error.reason and entries == ()
    reply, entries = send(app, tmp_path / "honest", **{"target-epsilon": 5.0, "local-steps": 2,
                                                       "privacy": "dpsgd"})
    assert not reply.has_error() and len(entries) == 1  # secret noise, a guarantee: trained
