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
