"""The server side of the base strategies and the Upcycled-FL wrapper, at its edges (from an adversarial
review): what the ledgers of an Upcycled run hold, the rows of its even rounds, degenerate
hyperparameters, and a resume from an even round."""

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from common.config import validate
from common.privacy.ledger import PrivacyLedger

SMALL = {"dataset": "synthetic", "num-clients": 3, "synthetic-dim": 5, "synthetic-classes": 3, "seed": 3,
         "local-epochs": 1, "lr": 0.05, "momentum": 0.5}


def _run(tmp_path: Path, **overrides):
    from server.inprocess import run_inprocess

    cfg = validate({**SMALL, "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state"),
                    **overrides})
    run_dir = run_inprocess(cfg, console=Console(file=io.StringIO()), threads=1)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return cfg, run_dir, rows


# --- 1. ledgers of an Upcycled run hold odd rounds only, whatever the mechanism ----------------------
def test_upcycled_dpfedavg_hu_ledgers_hold_odd_rounds_only(tmp_path, one_torch_thread):
    """Issue 5: 'the ledgers hold events for odd rounds only'. Every mechanism's entry carries the server
    round (Hu et al.'s zCDP entry carried the training-round index: a charge in round 2, a server-only
    round in which no client received anything); the training round is in its meta."""
    cfg, _, rows = _run(tmp_path, strategy="dpfedavg-hu", upcycled=True, **{
        "num-rounds": 4, "fraction-train": 1.0, "hu-sigma": 1.0, "hu-local-steps": 2, "batch-size": 4,
        "momentum": 0.0, "run-name": "hu-upcycled"})
    assert [r["clients"] for r in rows] == [3, 0, 3, 0]  # clients trained in rounds 1 and 3 only
    ledgers = sorted((tmp_path / "state").rglob("*.ledger.json"))
    assert len(ledgers) == 3
    for path in ledgers:
        ledger = PrivacyLedger.load(path)
        assert ledger.rounds() == [1, 3] and [e.meta["train-round"] for e in ledger.entries] == [1, 2]


# --- 2. pFedMe's personalised accuracy on Upcycled rows ---------------------------------------------
def test_upcycled_pfedme_every_row_reports_the_personalised_accuracy(tmp_path, one_torch_thread):
    """The suites point the reader to train_personal_accuracy (the number the paper reports for pFedMe),
    and the authors' code evaluates the personalised models every round, even ones included (they are
    unchanged there): an Upcycled run's even rows, its final row among them, carry it too."""
    _, _, rows = _run(tmp_path, strategy="pfedme", upcycled=True, lr=0.01, **{
        "num-rounds": 4, "fraction-train": 1.0, "run-name": "pfedme-upcycled"})
    assert [r["clients"] for r in rows] == [3, 0, 3, 0]
    assert "train_personal_accuracy" in rows[0]
    for odd, even in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert even.get("train_personal_accuracy") == odd["train_personal_accuracy"], even["round"]


# --- 3. hyperparameters that make a base's server (or local) update degenerate ----------------------
@pytest.mark.parametrize("strategy,key,value,why", [
    # m_t = 1 * m_t + 0 * Delta stays 0 (v0 = m0 = 0): x never moves, yet every round "updates" the model
    ("fedyogi", "yogi-beta1", 1.0, "beta1 = 1: the first moment never leaves 0"),
    # v_t stays 0: x += eta m / tau, a step of 100 m (10 Delta at round 1) instead of ~eta sign(Delta)
    ("fedyogi", "yogi-beta2", 1.0, "beta2 = 1: the second moment never leaves 0"),
    # w <- w - lambda lr (w - theta) with lambda = 0: the reply is the global model, which never moves
    ("pfedme", "pfedme-lambda", 0.0, "lambda = 0: the local model w never moves"),
    # the momentum buffer never decays (Hsu et al. take beta < 1)
    ("fedavgm", "server-momentum", 1.0, "momentum 1: every past step is applied again forever"),
])
def test_degenerate_base_hyperparameters_are_refused(strategy, key, value, why):
    """Reddi et al. take beta1, beta2 in [0, 1); pFedMe needs lambda > 0. Accepting the closed ends let a
    run report an untrained (or 100x over-stepped) model as its result."""
    from common.config import ConfigError

    with pytest.raises(ConfigError):
        validate({"strategy": strategy, key: value})


# --- guard (passes): a server that dies in an even round resumes to the uninterrupted run -----------
def test_guard_upcycled_scaffold_killed_in_an_even_round_resumes_exactly(tmp_path, monkeypatch):
    """The checkpoint of odd round 3 holds w_2, w_3 and SCAFFOLD's last control step; the resumed
    round 4 (no message) must extrapolate w_3 + theta (w_3 - w_2) and c as the whole run does."""
    import numpy as np

    import server.runner as runner
    from test_checkpoint import STATEFUL, config, rows, run

    base = {"strategy": "scaffold", "upcycled": True, "num-clients": 4, "fraction-train": 0.5, **STATEFUL}
    whole = run(config(tmp_path, "whole", **base), run_id=1)
    part = config(tmp_path, "part", checkpoint=True, **base)
    real, calls = runner.evaluate, []

    class Died(Exception):
        pass

    def evaluate(*args, **kwargs):  # the initial evaluation, then one per round: die in round 4
        calls.append(1)
        if len(calls) == 1 + 4:
            raise Died()
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate", evaluate)
    with pytest.raises(Died):
        run(part, run_id=2)
    monkeypatch.setattr(runner, "evaluate", real)
    resumed = run(part, run_id=3)
    assert [r["round"] for r in rows(resumed)] == [1, 2, 3, 4, 5]
    assert [r["accuracy"] for r in rows(resumed)] == pytest.approx([r["accuracy"] for r in rows(whole)])
    ma, mb = np.load(whole / "model.npz"), np.load(resumed / "model.npz")
    for key in ma.files:
        np.testing.assert_allclose(mb[key], ma[key], rtol=1e-5, atol=1e-6)
