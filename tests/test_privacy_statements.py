"""Every privacy statement privfed prints or writes names its delta, relation, sampling and
accountant correctly, and carries NOT A GUARANTEE wherever an unenforced assumption is used (review of session 17)."""

import io
import json
import math

import pytest
from rich.console import Console

from common.config import validate
from common.privacy.events import dpsgd_steps, objective_perturbation_release, zcdp_release
from common.privacy.hu import hu_entries
from common.privacy.ledger import PrivacyLedger
from server.privacy_mirror import PrivacyMirror
from server.report import epsilon_note

SMALL = {"dataset": "synthetic", "num-clients": 3, "synthetic-dim": 5, "synthetic-classes": 3, "seed": 3,
         "local-epochs": 1, "lr": 0.05, "momentum": 0.5}


# --- Hu et al. 'paper' accountant: the /r secure-aggregation credit is an unenforced assumption ---------
# reference/zcdp-secagg.md, ambiguity 4: "The /r secure-aggregation gain is heuristic ... no collusion, and
# all clients add honest noise ... Use the paper's formula for reproduction, but label it as such."
# A Hu run with hu-accountant = "paper" and secure aggregation (presets/hu-adult.toml) charges rho / r, but
# common/privacy/hu.py paper_assumption() only flags tau not divisible by m/gamma: the entry carries no
# assumption, summary.json lists none, and the epsilon note has no NOT A GUARANTEE.
def test_hu_paper_accountant_secure_aggregation_credit_is_labelled_not_a_guarantee():
    config = validate({"strategy": "dpfedavg-hu", "dataset": "adult", "adult-split": "hu-devices",
                       "num-clients": 16, "hu-accountant": "paper", "hu-local-steps": 10, "batch-size": 1221,
                       "hu-clip": 1.0, "hu-sigma": 1.0, "secure-aggregation": True, "fraction-train": 0.625,
                       "secagg-min-survivors": 10})
    (credited,) = hu_entries(config, {"hu-sigma": 1.0, "server-round": 1, "hu-clients-per-round": 10}, 2442)
    (plain,) = hu_entries(config, {"hu-sigma": 1.0, "server-round": 1, "hu-clients-per-round": 1}, 2442)
    assert math.isclose(credited.params["rho"] * 10, plain.params["rho"])  # the /r credit is charged
    assert "assumption" in credited.params, "rho / r (no collusion, honest noise) is charged without a label"
    mirror = PrivacyMirror(config, [0])
    mirror.record(0, [credited])
    note = epsilon_note({"config": dict(config), "privacy": mirror.summary()})
    assert "NOT A GUARANTEE" in note, note


# --- objective perturbation: a pure epsilon by basic composition, not an RDP accountant's figure -------
# server/report.py epsilon_note says "(epsilon, delta)-DP at delta = 1e-05 (rdp accountant)" for a ledger
# that holds only pure entries: the rdp accountant composes nothing, the epsilon is the sum of Thm 6.3's
# pure epsilons (delta = 0).
def test_objective_perturbation_note_names_basic_composition_of_pure_dp_not_the_rdp_accountant():
    config = validate({**SMALL, "strategy": "fedprox", "prox-mu": 0.5, "model": "logreg",
                       "privacy": "objective", "objective-alpha": 20.0})
    mirror = PrivacyMirror(config, [0])
    mirror.record(0, [objective_perturbation_release(20.0, 2.0, 1.0, 0.5, 100, round=1)])
    note = epsilon_note({"config": dict(config), "privacy": mirror.summary()})
    assert "rdp accountant" not in note, note
    assert "pure" in note, note
    row = mirror.round_metrics()  # the rows, the round line and the plot's axis say the same (review, session 18)
    assert row["delta"] == 0.0 and row["accountant"] == "pure, basic composition", row
    assert row["epsilon_max"] == mirror.ledgers[0].pure_epsilon()
    summary = mirror.summary()  # and summary.json (it said delta = target-delta, accountant rdp: session 20)
    assert (summary["delta"], summary["accountant"]) == (0.0, "pure, basic composition"), summary


# --- a ledger mixing neighbouring relations is not one (epsilon, delta) statement ----------------------
# DP-SGD entries are add/remove, Hu's zCDP entries replace-one: the RDP of the Poisson-subsampled Gaussian
# under add/remove does not bound it under replace-one, and a replace-one zCDP bound says nothing about
# add/remove. PrivacyLedger.report composes them into one epsilon anyway (and `privfed privacy ledger`
# prints it beside "neighbouring relation(s): add-remove, replace-one").
def test_ledger_refuses_one_epsilon_over_entries_of_different_neighbouring_relations():
    ledger = PrivacyLedger([dpsgd_steps(0.01, 1.0, 100, round=1), zcdp_release(0.05, round=2)])
    assert ledger.relations() == {"add-remove", "replace-one"}
    with pytest.raises(ValueError):
        ledger.epsilon(1e-5, accountant="rdp")


# --- metrics.jsonl: no examples-weighted average of the clients' epsilons -------------------------------
# Each private client replies with its ledger's "epsilon"; Flower's FedAvg aggregate_train averages the
# reply metrics weighted by num-examples and server/runner.py extra_train_metrics writes that into every
# round row as "train_epsilon" (upcycled-objective, 30 clients: train_epsilon 0.356 beside epsilon_max
# 1.902 and epsilon_mean 0.925). An examples-weighted mean of epsilons is no privacy statement of anyone.
def test_round_rows_write_no_examples_weighted_mean_of_client_epsilons(tmp_path, one_torch_thread):
    from server.inprocess import run_inprocess

    cfg = validate({**SMALL, "strategy": "fedprox", "prox-mu": 0.5, "model": "logreg", "privacy": "objective",
                    "num-rounds": 1, "fraction-train": 1.0, "results-dir": str(tmp_path), "run-name": "r",
                    "state-dir": str(tmp_path / "state")})
    run_dir = run_inprocess(cfg, console=Console(file=io.StringIO()))
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["epsilon_max"] > row["epsilon_mean"]  # the clients' |D_i| differ: so do their epsilons
    written = {k: v for k, v in row.items() if "epsilon" in k and k not in ("epsilon_max", "epsilon_mean")}
    for key, value in written.items():
        assert any(math.isclose(value, row[k], rel_tol=1e-9) for k in ("epsilon_max", "epsilon_mean")), \
            f"{key} = {value} is neither the max ({row['epsilon_max']}) nor the mean ({row['epsilon_mean']})"


@pytest.mark.timeout(120)
def test_a_delta_of_one_over_a_clients_size_or_more_is_said_to_guarantee_nothing(tmp_path, one_torch_thread):
    """target-delta = 0.5 for clients of ~100 records: a mechanism publishing a record outright is then
    (0, 0.5)-DP. The run printed 'epsilon 0.0000 at delta 0.5' as its guarantee (review of session 19)."""
    from server.inprocess import run_inprocess
    from server.runner import delta_warning

    printed = io.StringIO()
    config = validate({**SMALL, "privacy": "dpsgd", "local-steps": 2, "dp-sample-rate": 0.1, "target-delta": 0.5,
                       "num-rounds": 1, "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "s")})
    run_inprocess(config, console=Console(file=printed, width=300), threads=1)
    assert printed.getvalue().count("WARNING: target-delta = 0.5 is at least 1/|D_i|") == 2  # at the start, at the end
    assert delta_warning(config.replace(target_delta=1e-5), [100]) is None
    assert delta_warning(config.replace(target_delta=0.01), [100]) is not None
