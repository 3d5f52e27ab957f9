"""ALI-DPFL end to end on the in-process engine (tiny generated federation):
the server plans tau*, the clients run exactly tau DP-SGD steps, the ledgers
never pass the target, and with R_s < R_c the budget ends (almost) spent."""

import json
import logging

import pytest

from client.privacy import ledger_path
from common.config import ConfigError, validate
from common.privacy.accounting import ali_epsilon
from common.privacy.ledger import PrivacyLedger
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation

Q, SIGMA, DELTA, CLIENTS = 0.2, 1.0, 1e-5, 3


def ali_config(tmp_path, steps_budget, rounds, **extra):
    # a target a hair above eps(steps_budget): R_c = steps_budget, and eps(R_c) is within 1% of it
    target = ali_epsilon(steps_budget, Q, SIGMA, DELTA) * 1.001
    return validate({"strategy": "ali-dpfl", "num-clients": CLIENTS, "num-rounds": rounds, "privacy": "dpsgd",
                     "dp-sample-rate": Q, "dp-noise-multiplier": SIGMA, "dp-clip": 1.0,
                     "lr": 0.1, "target-epsilon": target, "target-delta": DELTA, "accountant": "ali-eq12",
                     "results-dir": str(tmp_path), "run-name": "ali", "synthetic-dim": 10, **extra})


def run(config, run_id):
    with InProcessGrid("client.app:app", dict(config), CLIENTS, run_id=run_id) as grid:
        results = run_federation(grid, config)
    rows = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]
    ledgers = [PrivacyLedger.load(ledger_path(config, {}, run_id, p)) for p in range(CLIENTS)]
    return rows, ledgers


def test_ali_needs_dpsgd_and_a_budget():
    with pytest.raises(ConfigError, match="ali-dpfl"):
        validate({"strategy": "ali-dpfl", "privacy": "dpsgd", "local-steps": 1})


def test_rs_below_rc_spends_the_budget_exactly(tmp_path):
    config = ali_config(tmp_path, steps_budget=13, rounds=4, **{"eval-every": 3})
    rows, ledgers = run(config, run_id=101)
    assert [r["evaluated"] for r in rows][-1] is True and rows[0]["evaluated"] is False  # eval-every
    target = float(config["target-epsilon"])
    assert len(rows) <= 4
    taus = [r["ali_tau"] for r in rows]
    assert sum(taus) == 13 and all(r["ali_rc"] == 13 for r in rows)  # capped at R_c - t, never more
    assert all("ali_mu" in r and "ali_tau_next" in r for r in rows)
    for ledger in ledgers:  # the client's own ledger: per-round entries of exactly tau steps
        assert [e.params["steps"] for e in ledger.entries] == taus
        eps = ledger.epsilon(DELTA, accountant="ali-eq12")
        assert target * 0.99 <= eps <= target
    assert rows[-1]["epsilon_max"] == pytest.approx(ledgers[0].epsilon(DELTA, accountant="ali-eq12"))


def test_rs_at_least_rc_runs_tau_one_and_stops_at_rc(tmp_path):
    config = ali_config(tmp_path, steps_budget=5, rounds=8)
    rows, ledgers = run(config, run_id=102)
    assert [r["ali_tau"] for r in rows] == [1] * 5  # Lemma 1; the run ends when t = R_c
    for ledger in ledgers:
        assert ledger.steps() == 5
        assert ledger.epsilon(DELTA, accountant="ali-eq12") <= float(config["target-epsilon"])


def test_paper_estimator_reports_true_gradients_and_warns(tmp_path, caplog):
    config = ali_config(tmp_path, steps_budget=9, rounds=3, **{"ali-mu-estimator": "paper"})
    with caplog.at_level(logging.WARNING, logger="privfed.ali"):
        rows, ledgers = run(config, run_id=103)
    assert any("leaks outside the DP accounting" in r.message for r in caplog.records)
    assert all(r["ali_mu_raw"] is not None and r["ali_mu_raw"] > 0 for r in rows)
    assert sum(r["ali_tau"] for r in rows) == 9
    assert all(ledger.steps() == 9 for ledger in ledgers)  # the leak adds no ledger entry: it is unaccounted


def test_secure_aggregation_runs_the_same_schedule_and_budget(tmp_path):
    """ALI-DPFL's aggregate is a weighted sum and its default mu estimator reads only that aggregate, so it
    runs under secure aggregation: the same tau schedule, mu estimates and model as in plaintext (up to the
    fixed-point quantisation), and the same ledgers."""
    extra = {"eval-every": 1, "dp-noise-seed": "run-seed"}  # the same noise in both
    plain, plain_ledgers = run(ali_config(tmp_path / "plain", steps_budget=13, rounds=4, **extra), run_id=111)
    secure, secure_ledgers = run(ali_config(tmp_path / "secure", steps_budget=13, rounds=4,
                                            **{**extra, "secure-aggregation": True, "secagg-min-survivors": 3}),
                                 run_id=112)
    assert [r["ali_tau"] for r in secure] == [r["ali_tau"] for r in plain]
    for a, b in zip(plain, secure, strict=True):
        assert b["accuracy"] == pytest.approx(a["accuracy"], abs=2e-3)
        if a["ali_mu_raw"] is not None:
            assert b["ali_mu_raw"] == pytest.approx(a["ali_mu_raw"], rel=1e-3)
    assert [lg.steps() for lg in secure_ledgers] == [lg.steps() for lg in plain_ledgers]
    with pytest.raises(ConfigError, match="ali-mu-estimator"):
        ali_config(tmp_path, steps_budget=13, rounds=4, **{"secure-aggregation": True, "ali-mu-estimator": "paper"})
