"""The data owner's own cap on epsilon (node config `max-epsilon`, client/node.py): the node's budget is the
smaller of it and the run's, and such a node refuses a run without a privacy mechanism (DESIGN principle 3)."""

import pytest
from flwr.app import Context, RecordDict

import client.node
from client.node import NodeSetupError, node_run_config
from client.privacy import ledger_path
from common.config import validate
from common.privacy.ledger import PrivacyLedger
from server.inprocess_grid import InProcessGrid
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
