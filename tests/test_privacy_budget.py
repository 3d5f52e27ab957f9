"""Client ledgers and budgets through the real ClientApp (in-process engine)."""

import json

import pytest

import client.node
from client.privacy import ledger_path
from common.config import ConfigError, validate
from common.privacy.accounting import dpsgd_epsilon
from common.privacy.ledger import PrivacyLedger
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation

Q, SIGMA, STEPS, DELTA = 0.2, 1.0, 5, 1e-5


def dp_config(tmp_path, **extra):
    return validate({"num-clients": 3, "num-rounds": 4, "privacy": "dpsgd", "local-steps": STEPS,
                     "dp-sample-rate": Q, "dp-noise-multiplier": SIGMA, "dp-clip": 1.0, "lr": 0.5,
                     "target-delta": DELTA, "results-dir": str(tmp_path), "run-name": "dp", **extra})


def run(config, run_id):
    with InProcessGrid("client.app:app", dict(config), int(config["num-clients"]), run_id=run_id) as grid:
        return run_federation(grid, config)


def test_dpsgd_needs_steps():
    with pytest.raises(ConfigError, match="local-steps"):
        validate({"privacy": "dpsgd"})


def test_epsilon_per_round_comes_from_the_ledgers(tmp_path):
    config = dp_config(tmp_path)
    results = run(config, run_id=11)
    rows = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # every client trains every round: epsilon of round r = r * STEPS steps
        expected = dpsgd_epsilon(Q, SIGMA, r["round"] * STEPS, DELTA)
        assert r["epsilon_max"] == pytest.approx(expected, rel=1e-9)
        assert r["accountant"] == "rdp" and r["delta"] == DELTA
    for p in range(3):  # the client's own ledger on disk says the same
        ledger = PrivacyLedger.load(ledger_path(config, {}, 11, p))
        assert ledger.steps() == 4 * STEPS
        assert ledger.epsilon(DELTA) == pytest.approx(rows[-1]["epsilon_max"], rel=1e-12)
    summary = json.loads((results / "summary.json").read_text())
    assert summary["privacy"]["ledgers"]["0"]["epsilon"]["pld"] <= summary["privacy"]["ledgers"]["0"]["epsilon"]["rdp"]
    assert (results / "accuracy_vs_epsilon.png").exists()


def test_restarted_client_keeps_its_ledger(tmp_path):
    config = dp_config(tmp_path, **{"num-rounds": 2})
    run(config, run_id=22)
    client.node._local.clear()  # a fresh client process: nothing in memory
    run({**config, "run-name": "dp-again"}, run_id=22)  # the same Flower run goes on with restarted clients
    ledger = PrivacyLedger.load(ledger_path(config, {}, 22, 0))
    assert ledger.steps() == 4 * STEPS  # 2 + 2 rounds, never a fresh ledger


def test_client_at_budget_refuses_and_run_ends_cleanly(tmp_path):
    # Budget for 2 rounds of STEPS steps but not 3.
    target = (dpsgd_epsilon(Q, SIGMA, 2 * STEPS, DELTA) + dpsgd_epsilon(Q, SIGMA, 3 * STEPS, DELTA)) / 2
    config = dp_config(tmp_path, **{"target-epsilon": target, "num-rounds": 6})
    results = run(config, run_id=33)
    rows = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]  # round 3: all refuse; then the run ends
    assert rows[-1]["clients"] == 3 and rows[-1]["epsilon_max"] <= target
    for p in range(3):
        ledger = PrivacyLedger.load(ledger_path(config, {}, 33, p))
        assert ledger.steps() == 2 * STEPS  # the refused round left the ledger unchanged
        assert ledger.epsilon(DELTA) <= target


def test_dpsgd_refuses_strategies_whose_local_rule_it_would_drop():
    for strategy in ("scaffold", "feddyn", "pfedme", "dpfedavg-hu"):
        with pytest.raises(ConfigError, match=strategy):
            validate({"privacy": "dpsgd", "local-steps": 5, "strategy": strategy})


def test_dp_fedprox_keeps_the_proximal_term_at_the_same_privacy_cost(tmp_path):
    """DP-FedProx = DP-SGD + mu (w - w_global) after the noise: the model stays nearer the global one,
    and the ledgers (post-processing adds nothing) equal DP-FedAvg's."""
    import numpy as np

    from server.runner import initial_model

    distance, epsilon = {}, {}
    for strategy in ("fedavg", "fedprox"):
        mu = {"prox-mu": 1.5} if strategy == "fedprox" else {}
        config = dp_config(tmp_path / strategy, **{"num-rounds": 1, "strategy": strategy, **mu})
        results = run(config, run_id=33)
        start = [p.detach().numpy() for p in initial_model(config).parameters()]
        with np.load(results / "model.npz") as final:
            end = [final[k] for k in final.files]
        distance[strategy] = float(np.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(end, start))))
        epsilon[strategy] = json.loads((results / "metrics.jsonl").read_text().splitlines()[-1])["epsilon_max"]
    assert distance["fedprox"] < 0.8 * distance["fedavg"]
    assert epsilon["fedprox"] == epsilon["fedavg"] == pytest.approx(dpsgd_epsilon(Q, SIGMA, STEPS, DELTA))
