"""ALI-DPFL's per-client step counter t, its budget and its checkpointed state (review, session 13)."""

import json

import pytest

import client.node
from client.privacy import ledger_path
from common.config import ConfigError
from common.privacy.ledger import PrivacyLedger
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation
from fault_grids import DiesAfter, Killed
from tests.test_ali_runs import CLIENTS, DELTA
from tests.test_ali_runs import ali_config as ali_runs_config


def ali_config(tmp_path, steps_budget, rounds, **extra):
    return ali_runs_config(tmp_path, steps_budget, rounds, **{"results-dir": str(tmp_path / "results"),
                                                              "state-dir": str(tmp_path / "state"), **extra})


def run(cfg, run_id, die_after=None, after_replies=False):
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), CLIENTS, run_id=run_id) as grid:
        if die_after is None:
            return run_federation(grid, cfg)
        with pytest.raises(Killed):
            run_federation(DiesAfter(grid, die_after, after_replies), cfg)


def rows_of(results):
    return [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]


def test_resume_after_a_lost_round_keeps_t_equal_to_the_client_ledgers(tmp_path):
    """The server dies after the clients charged round 2 but before checkpointing it; on resume the
    clients hold round 2's tau in their ledgers (and the mirror counts it), so the strategy's t must too:
    otherwise it plans the last round past what the clients can afford and they refuse it."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=4, checkpoint=True, **{"dp-noise-seed": "run-seed"})
    run(cfg, run_id=1, die_after=2, after_replies=True)
    results = run(cfg, run_id=2)
    rows = rows_of(results)
    steps = [PrivacyLedger.load(ledger_path(cfg, {}, 2, p)).steps() for p in range(CLIENTS)]
    assert [rows[-1]["ali_steps"]] * CLIENTS == steps  # the server's t after the run = each client's ledger
    target = float(cfg["target-epsilon"])
    for p in range(CLIENTS):  # and, R_s < R_c, no refused last round: the budget ends spent (within 1%)
        assert PrivacyLedger.load(ledger_path(cfg, {}, 2, p)).epsilon(DELTA, accountant="ali-eq12") >= 0.99 * target


def test_partial_participation_is_refused_for_ali_dpfl(tmp_path):
    """fraction-train < 1: one tau for all from the max t retired every client once the most-trained one
    reached R_c (ledgers [13, 2, 11] of 13, 3 of 6 rounds unused). ALI-DPFL plans for full participation
    (the paper's setting), so a partial one is refused at validation."""
    with pytest.raises(ConfigError, match="fraction-train"):
        ali_config(tmp_path, steps_budget=13, rounds=6, **{"fraction-train": 0.67})


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def run_capped(cfg, cap_steps):
    """A run whose first node's data owner caps its epsilon at eps(cap_steps) (node config max-epsilon)."""
    from common.privacy.accounting import ali_epsilon
    from tests.test_ali_runs import Q, SIGMA

    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), CLIENTS, run_id=1) as grid:
        grid.contexts[grid.node_ids[0]].node_config["max-epsilon"] = ali_epsilon(cap_steps, Q, SIGMA, DELTA) * 1.0005
        return run_federation(grid, cfg)


@pytest.mark.timeout(120)
def test_a_secure_run_ends_when_too_few_clients_remain_to_form_a_round(tmp_path):
    """secagg-min-survivors = 3 = every client; node 0's owner caps its epsilon at eps(5 steps), so it refuses
    round 2 (4 + 4 > 5) and is retired. No secure round can be decoded after that, yet the run went on to
    R_s = 6, each round aborted before any instruction left (rows' clients 3, 3, 0, 0, 0, 0)."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=6, **{"secure-aggregation": True,
                                                              "secagg-min-survivors": CLIENTS,
                                                              "ali-tau-max": 4, "ali-tau-init": 4})
    rows = rows_of(run_capped(cfg, cap_steps=5))
    assert [r["clients"] for r in rows] == [3, 3]


@pytest.mark.timeout(120)
def test_a_tau_beyond_a_capped_clients_budget_is_a_refusal_not_a_failure(tmp_path):
    """Node 0's owner caps its epsilon at eps(3 steps), so its own R_c is 3 while the server plans with the run's
    13. Round 1's tau = 4 came back as a plain ValueError ("this run allows 1..3"): a failed reply, node 0 kept
    selected and its t charged 4 steps it never ran (failed_replies 2 over 4 rounds). A budget refusal (4001)
    retires it, and the server takes back the steps it planned."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=4)
    results = run_capped(cfg, cap_steps=3)
    assert json.loads((results / "summary.json").read_text())["failed_replies"] == 0
    clients = [r["clients"] for r in rows_of(results)]
    assert clients[0] == 3 and set(clients[1:]) == {2}  # refused in round 1, then not selected


@pytest.mark.timeout(120)
def test_a_secure_run_cut_short_ends_on_an_evaluated_row(tmp_path):
    """With eval-every = 3, the run that secure aggregation ends after round 2 (too few clients left) ended on a
    carried row: summary.json's final accuracy was the initial model's, round 1's update never measured."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=6, **{"secure-aggregation": True, "secagg-min-survivors": 3,
                                                              "ali-tau-max": 4, "ali-tau-init": 4, "eval-every": 3})
    results = run_capped(cfg, cap_steps=5)
    rows, summary = rows_of(results), json.loads((results / "summary.json").read_text())
    assert rows[-1]["round"] == 2 and rows[-1]["evaluated"] is True
    assert summary["final"]["loss"] == rows[-1]["loss"] != summary["initial"]["loss"]


@pytest.mark.timeout(120)
def test_a_client_left_out_of_one_secure_round_catches_up_with_the_others(tmp_path):
    """Secure aggregation leaves one node out of round 1; R_s = 6, tau* = 3 (ali-tau-max = ali-tau-init). With one
    tau* for all it stayed 3 steps behind: the others spent R_c = 13 in round 5 and retired, and it was left
    alone, below secagg-min-survivors, at 12 of 13 (ledgers [13, 12, 13]). It now runs the steps it is behind
    in its next round, and every ledger ends at R_c."""
    from tests.test_lost_round import LateEnrollment

    cfg = ali_config(tmp_path, steps_budget=13, rounds=6, **{"secure-aggregation": True, "secagg-min-survivors": 2,
                                                              "ali-tau-max": 3, "ali-tau-init": 3})
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), CLIENTS, run_id=1) as grid:
        results = run_federation(LateEnrollment(grid, times=2), cfg)
    rows = rows_of(results)
    assert rows[0]["clients"] == 2 and rows[1]["ali_tau"] == 6  # round 2: 3 + the 3 it is behind
    assert [PrivacyLedger.load(ledger_path(cfg, {}, 1, p)).steps() for p in range(CLIENTS)] == [13] * CLIENTS


@pytest.mark.timeout(120)
def test_an_ali_node_capped_below_one_step_refuses_instead_of_failing_the_run(tmp_path):
    """A data owner whose max-epsilon allows no DP-SGD step (its R_c = 0) failed node setup: the run config
    re-validated with target-epsilon = the cap was refused ("allows no DP-SGD step ... raise target-epsilon", a
    value the experimenter never set), and the run died at enrollment. The node now refuses (4001)."""
    from common.privacy.accounting import ali_epsilon
    from tests.test_ali_runs import Q, SIGMA

    cfg = ali_config(tmp_path, steps_budget=13, rounds=3)
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), CLIENTS, run_id=1) as grid:
        grid.contexts[grid.node_ids[0]].node_config["max-epsilon"] = ali_epsilon(1, Q, SIGMA, DELTA) * 0.5
        results = run_federation(grid, cfg)
    assert json.loads((results / "summary.json").read_text())["failed_replies"] == 0
    clients = [r["clients"] for r in rows_of(results)]
    assert clients[0] == CLIENTS and set(clients[1:]) == {CLIENTS - 1}  # refused in round 1, then not selected
