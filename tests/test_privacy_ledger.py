"""The privacy ledger: events, composition, post-processing, pure-DP line, persistence."""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import dp_accounting as dpa
import pytest

from common.privacy import accounting as acc
from common.privacy.events import (
    LedgerEntry,
    dpsgd_steps,
    gaussian_release,
    objective_perturbation_release,
    output_perturbation_release,
    output_perturbation_sensitivity,
    post_processing,
    pure_dp_release,
    zcdp_release,
)
from common.privacy.ledger import PrivacyLedger

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-5


def test_event_kinds_map_to_dp_accounting_events():
    e = dpsgd_steps(0.01, 1.2, 7).to_dp_event()
    assert e == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.2)), 7)
    assert zcdp_release(0.3).to_dp_event() == dpa.ZCDpEvent(0.3)
    g = output_perturbation_release(clip_norm=10, noise_std=0.8, dataset_size=200)
    assert g.to_dp_event() == dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(0.8 / (10 / 200)), 1)
    assert g.params["relation"] == "add-remove" and g.meta["mechanism"] == "output-perturbation"
    assert post_processing(round=2).to_dp_event() == dpa.NoOpDpEvent()
    with pytest.raises(ValueError, match="pure"):
        pure_dp_release(1.0).to_dp_event()
    with pytest.raises(ValueError, match="kind"):
        LedgerEntry("laplace", {})


def test_output_perturbation_sensitivity_rules():
    assert output_perturbation_sensitivity(10, 200, "paper") == (0.05, "add-remove")
    assert output_perturbation_sensitivity(10, 200, "ball") == (20.0, "any")
    with pytest.raises(ValueError, match="rule"):
        output_perturbation_sensitivity(10, 200, "half")


def test_upcycled_output_perturbation_matches_theorem_6_2():
    tau, sigma, n, m = 10.0, 0.8, 224, 40
    ledger = PrivacyLedger()
    for r in range(1, 2 * m + 1):
        if r % 2:
            ledger.record(output_perturbation_release(tau, sigma, n, round=r))
        else:
            ledger.record(post_processing(round=r, note="Upcycled even round: server-only extrapolation"))
    paper = acc.upcycled_output_epsilon_from_params(m, tau, sigma, n, DELTA)
    assert ledger.epsilon(DELTA, "upcycled-thm6.2") == pytest.approx(paper, rel=1e-12)
    # RDP (and PLD) on the same Gaussian events is tighter than the moments-accountant closed form
    assert ledger.epsilon(DELTA, "pld") <= ledger.epsilon(DELTA, "rdp") <= paper
    # post-processing adds nothing, and the ledger shows it
    odd_only = PrivacyLedger([e for e in ledger.entries if not e.is_post_processing])
    assert ledger.epsilon(DELTA) == odd_only.epsilon(DELTA)
    assert ledger.report(DELTA).counts == {"gaussian": m, "post-processing": m}
    assert any("post-processing" in line and "no privacy cost" in line for line in ledger.summary_lines(DELTA))


def test_upcycled_halves_the_leaking_rounds():
    # the paper's ratio for equal total rounds: sqrt((M/2)/0.64 / M) ~ 0.884 with sigma 1 -> 0.8
    base = acc.upcycled_output_epsilon_from_params(80, 10, 1.0, 224, 1e-3)
    upc = acc.upcycled_output_epsilon_from_params(40, 10, 0.8, 224, 1e-3)
    assert upc / base == pytest.approx(0.884, abs=0.01)


def test_pure_entries_are_on_their_own_line():
    obj = [objective_perturbation_release(alpha=20, u1=1.0, u2=0.25, mu=0.5, dataset_size=224, round=r)
           for r in (1, 3)]
    per = (2 * 20 * 1.0 * 0.5 + 2.8 * 0.25) / (224 * 0.5)
    assert obj[0].params["epsilon"] == pytest.approx(per)
    # beside DP-SGD (add/remove) as pure entries of that relation: objective perturbation's are replace-one
    ledger = PrivacyLedger([*(pure_dp_release(e.params["epsilon"], relation="add-remove") for e in obj),
                            dpsgd_steps(0.02, 1.0, 100)])
    for name in ("rdp", "pld"):
        rep = ledger.report(DELTA, name)
        assert rep.pure == pytest.approx(2 * per)
        assert rep.approx == pytest.approx(acc.dpsgd_epsilon(0.02, 1.0, 100, DELTA, accountant=name), rel=1e-9)
        assert rep.total == pytest.approx(rep.approx + rep.pure)
    only_pure = PrivacyLedger(obj)
    assert only_pure.epsilon(DELTA) == pytest.approx(2 * per)
    assert acc.upcycled_objective_epsilon([20, 20], 1.0, 0.25, 0.5, 224) == pytest.approx(2 * per)
    with pytest.raises(ValueError, match="u2"):
        objective_perturbation_release(alpha=20, u1=1.0, u2=100.0, mu=0.5, dataset_size=224)


def test_paper_accountants_refuse_foreign_entries():
    ledger = PrivacyLedger([dpsgd_steps(0.02, 1.0, 10), zcdp_release(0.1, relation="add-remove")])
    with pytest.raises(ValueError, match="covers"):
        ledger.epsilon(DELTA, "ali-eq12")
    with pytest.raises(ValueError, match="accountant"):
        ledger.epsilon(DELTA, "bogus")


def test_would_exceed_does_not_mutate_and_remaining_steps():
    ledger = PrivacyLedger([dpsgd_steps(0.015, 1.1, 100, round=1)])
    before = ledger.to_json()
    planned = [dpsgd_steps(0.015, 1.1, 300, round=2)]
    eps_after = PrivacyLedger([*ledger.entries, *planned]).epsilon(DELTA)
    assert ledger.would_exceed(planned, eps_after - 1e-6, DELTA)
    assert not ledger.would_exceed(planned, eps_after + 1e-6, DELTA)
    assert ledger.to_json() == before
    assert ledger.epsilon(DELTA, extra=planned) == pytest.approx(eps_after)
    # remaining steps = R_c - steps already taken (same q, sigma)
    rc = acc.max_steps(2.0, DELTA, 0.015, 1.1)
    assert ledger.remaining_steps(2.0, DELTA, 0.015, 1.1) == rc - 100
    assert ledger.steps() == 100 and ledger.rounds() == [1]
    assert PrivacyLedger().remaining_steps(0.01, DELTA, 0.5, 0.5) == 0


def test_empty_ledger_has_zero_epsilon():
    for name in ("rdp", "pld", "hu-thm1"):
        assert PrivacyLedger().epsilon(DELTA, name) == 0.0
    assert PrivacyLedger([post_processing(round=1)]).epsilon(DELTA) == 0.0


def _mixed_ledger(path=None):
    ledger = PrivacyLedger(owner="client-3", path=path)
    ledger.record(
        dpsgd_steps(256 / 10000, 1.0, 200, round=1, method="fedlap"),
        post_processing(round=1, note="synthesis"),
        output_perturbation_release(10.0, 0.8, 224, round=3),
        gaussian_release(1.3, 0.1, count=3, relation="any", round=5),
        zcdp_release(0.0123456789, relation="add-remove", round=7),  # one relation: a ledger composes no two
        pure_dp_release(0.1 + 0.2, relation="add-remove", round=9),  # a float with no short exact decimal
    )
    return ledger


def test_json_round_trip_is_exact(tmp_path):
    ledger = _mixed_ledger()
    path = ledger.save(tmp_path / "ledger.json")
    again = PrivacyLedger.load(path)
    assert again == ledger and again.entries == ledger.entries
    assert again.entries[-1].params["epsilon"] == 0.1 + 0.2
    assert again.epsilon(DELTA) == ledger.epsilon(DELTA)
    assert again.owner == "client-3"
    [json.loads(line) for line in path.read_text().splitlines()]  # strict JSON, one object a line


def test_record_saves_and_open_never_starts_fresh(tmp_path):
    path = tmp_path / "state" / "privacy-ledger.json"
    ledger = PrivacyLedger.open(path, owner="client-3")
    assert path.exists() and len(ledger) == 0
    ledger.record(dpsgd_steps(0.01, 1.0, 50, round=1))
    assert len(PrivacyLedger.open(path)) == 1
    path.write_text("{ not json")
    with pytest.raises(ValueError):
        PrivacyLedger.open(path)
    path.write_text(json.dumps({"format": "something-else", "version": 1, "entries": []}))
    with pytest.raises(ValueError, match="ledger"):
        PrivacyLedger.open(path)


def test_atomic_save_keeps_old_ledger_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path)
    ledger.record(dpsgd_steps(0.01, 1.0, 50, round=1))
    old = path.read_text()

    def boom(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        ledger.save()  # a whole-file write (records append)
    assert path.read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json"]  # no temp files left


_CHILD = r"""
import os, sys, signal
sys.path.insert(0, sys.argv[2])
from common.privacy.ledger import PrivacyLedger
from common.privacy.events import dpsgd_steps
ledger = PrivacyLedger.open(sys.argv[1], owner="node-7")
r = len(ledger) + 1
ledger.record(dpsgd_steps(0.015, 1.1, 10, round=r))
os.kill(os.getpid(), signal.SIGKILL)   # die without any cleanup
"""


def test_killed_and_restarted_client_keeps_its_ledger(tmp_path):
    path = tmp_path / "node-7" / "privacy-ledger.json"
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(REPO)], capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    ledger = PrivacyLedger.open(path, owner="node-7")
    assert [e.round for e in ledger.entries] == [1, 2]
    assert ledger.steps() == 20
    assert ledger.epsilon(DELTA) == pytest.approx(acc.dpsgd_epsilon(0.015, 1.1, 20, DELTA))
    with pytest.raises(ValueError, match="belongs"):
        PrivacyLedger.open(path, owner="node-8")


def test_summary_lines_mention_relations_and_accountants():
    lines = _mixed_ledger().summary_lines(DELTA)
    text = "\n".join(lines)
    assert "add-remove" in text and "any" in text
    assert "epsilon [rdp/balle]" in text
    assert "epsilon [pld]: n/a" in text  # the bare zCDP entry
    assert "pure-DP entries" in text
    assert math.isfinite(_mixed_ledger().epsilon(DELTA))


def test_two_neighbouring_relations_give_no_epsilon_but_a_readable_summary():
    ledger = PrivacyLedger([dpsgd_steps(0.02, 1.0, 10), zcdp_release(0.1)])  # add-remove and replace-one
    with pytest.raises(ValueError, match="different neighbouring relations"):
        ledger.epsilon(DELTA)
    text = "\n".join(ledger.summary_lines(DELTA))
    assert "epsilon [rdp]: n/a" in text and "add-remove, replace-one" in text


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_an_entry_with_a_numpy_count_is_refused_where_it_is_made():
    """A NumPy step count passed LedgerEntry's check (for one commit) and then failed to be written: JSON
    refuses int64. The constructor only makes entries the ledger can record."""
    import numpy as np

    from common.privacy.events import LedgerEntry

    params = {"sample_rate": 0.1, "noise_multiplier": 1.5, "steps": np.int64(10), "relation": "add-remove"}
    with pytest.raises(ValueError, match="steps"):
        LedgerEntry("dpsgd", params)
