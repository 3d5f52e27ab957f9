"""What a run does when training diverges or its numbers stop being finite (an adversarial review, session
20: each test failed on the code it reviewed). In-process engine, tiny synthetic configs."""

import io
import json
import math
import re

import numpy as np
import pytest
import torch
from rich.console import Console

import client.node
from common.config import ConfigError, validate
from common.evaluation import evaluate
from server.checkpoint import CheckpointError
from server.inprocess import run_inprocess
from server.report import METRICS, collect, load_suite

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = {"dataset": "synthetic", "num-clients": 2, "synthetic-dim": 5}
# FedYogi's server step adds ~yogi-lr per round: |w| ~6e5 after round 1 (fine), ~1.2e6 after round 2 (diverged)
DIVERGES_IN_ROUND_2 = {"strategy": "fedyogi", "yogi-lr": 6e5, "num-rounds": 3}


def run(tmp_path, **overrides):
    client.node._local.clear()
    config = validate({**BASE, "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state"),
                       **overrides})
    return run_inprocess(config, console=Console(file=io.StringIO(), width=400))


def test_a_server_step_that_makes_the_global_model_infinite_is_not_reported_as_a_result(tmp_path):
    """All clients honest; FedYogi's own server step (yogi-lr 1e39) overflows float32, so the global model
    is inf after round 1. The runner never checks its aggregate: every later round each client refuses
    the instruction ("the instruction's model holds NaN or infinite values"), the run ends normally,
    model.npz holds inf and summary.json states final accuracy 0.5455 (the class-0 rate: argmax of NaN
    logits is 0), which a suite averages in like any other seed. Measured: no error, final
    {'accuracy': 0.5454..., 'loss': None}, model.npz max |w| = inf."""
    out = run(tmp_path, strategy="fedyogi", **{"yogi-lr": 1e39, "num-rounds": 3, "run-name": "y", "eval-every": 2})
    summary = json.loads((out / "summary.json").read_text())
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["evaluated"] is True  # the diverged round is evaluated (eval-every would have skipped it)
    assert summary["final"] == {"accuracy": None, "loss": None, "round": 1}  # NaN, and the run ended there
    assert summary["diverged"]["round"] == 1 and "NaN or inf" in summary["diverged"]["why"]
    assert summary["failed_replies"] == 0  # no client was asked to train on the diverged model


def test_the_accuracy_of_a_model_with_nan_weights_is_not_a_number():
    """common/evaluation.py: NaN logits -> argmax picks class 0 for every example, so a NaN model
    'scores' the test set's class-0 rate (here 0.75) instead of NaN. Every caller (summary final
    accuracy, best-accuracy, accuracy-at-epsilon, the hyperparameter searches' max) then reads a
    diverged model as a valid, possibly winning, result; the report's "a diverged run's non-finite
    value is left out of the mean" never fires for accuracy metrics."""
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(math.nan)
    x = np.zeros((4, 3), dtype=np.float32)
    y = np.array([0, 0, 0, 1])
    loss, accuracy = evaluate(model, x, y, torch.device("cpu"))
    assert math.isnan(loss)
    assert math.isnan(accuracy), accuracy


def test_replies_screened_out_are_counted_in_the_failed_replies(tmp_path):
    """lr = 1e6: the clients' honest but diverging updates exceed the screen's +-1e6 bound and are dropped
    ("dropping reply ... holds values beyond +-1e+06"); in round 3 both are, and "the global model is
    unchanged". Yet every row says failed 0 and summary.json failed_replies = 0, so `privfed repro`'s
    note ("N train replies failed or timed out") says nothing: a run that lost 4 of its 6 updates reads
    as the planned experiment. Measured: rows failed = [0, 0, 0], summary failed_replies = 0."""
    out = run(tmp_path, lr=1e6, **{"num-rounds": 3, "run-name": "big"})
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert rows[-1]["train_loss"] is None  # round 3 had no usable reply
    assert summary["failed_replies"] > 0 or sum(r.get("dropped", 0) for r in rows) > 0, (
        [r["failed"] for r in rows], summary["failed_replies"])


def test_the_same_command_again_after_a_diverged_checkpointed_run_does_not_blame_another_model(tmp_path):
    """A checkpointed FedYogi run diverges in round 1 (yogi-lr 1e39) and finishes. Running the same command
    again (a no-op resume for a finished run) fails with "checkpoint ... holds another model than this
    run's (model array '1.weight' holds NaN or inf)": it is this run's own model, which the run itself
    saved; the message sends the user looking for a mixed-up run-name instead of at the divergence."""
    overrides = {"strategy": "fedyogi", "yogi-lr": 1e39, "num-rounds": 1, "checkpoint": True, "run-name": "ck"}
    for _ in range(2):
        try:
            run(tmp_path, **overrides)
        except Exception as err:  # noqa: BLE001 - a fix may refuse, but not by blaming another model
            assert "another model" not in str(err), err


def test_accuracy_metrics_of_a_diverged_run_do_not_crash_the_report():
    """A diverged run's last row has accuracy null (NaN written as null). accuracy-at-round and
    accuracy-at-epsilon call float(None): TypeError, so `privfed repro`/`privfed report` crash on any suite
    with such a metric (upcycled-privacy) as soon as one seed diverged. final-accuracy returns NaN."""
    rows = [{"round": 1, "accuracy": 0.5, "loss": 1.0, "epsilon_max": 0.5},
            {"round": 2, "accuracy": None, "loss": None, "epsilon_max": 0.9}]
    for name, param in (("accuracy-at-round", 2), ("accuracy-at-epsilon", 1.0)):
        value, _ = METRICS[name].fn(rows, {"diverged": {"round": 2, "why": "x"}}, param)
        assert math.isnan(value), (name, value)


def test_the_same_command_after_a_finished_diverged_checkpointed_run_spends_no_more_privacy(tmp_path):
    """The diverged round is not checkpointed, so the same command again resumed from round 1, re-instructed
    round 2 (the clients charged it again) and overwrote summary.json: round 2 epsilon_max 0.99944 after the
    first run, 1.01438 after the second. Now refused, also from another results-dir (a review of session 20:
    the refusal read only <results-dir>/<run-name>/summary.json)."""
    overrides = {**DIVERGES_IN_ROUND_2, "checkpoint": True, "run-name": "ck", "privacy": "dpsgd",
                 "target-epsilon": 0, "local-steps": 2, "dp-noise-multiplier": 1.0, "dp-noise-seed": "run-seed",
                 "checkpoint-dir": str(tmp_path / "ckpts")}
    first = run(tmp_path, **overrides)
    assert json.loads((first / "summary.json").read_text())["diverged"]["round"] == 2
    spent = json.loads((first / "metrics.jsonl").read_text().splitlines()[-1])["epsilon_max"]
    for results in (tmp_path / "results", tmp_path / "elsewhere"):
        with pytest.raises(CheckpointError, match="diverged in round 2.*charge the clients again"):
            client.node._local.clear()
            run_inprocess(validate({**BASE, **overrides, "results-dir": str(results),
                                    "state-dir": str(tmp_path / "state")}),
                          console=Console(file=io.StringIO(), width=400))
    assert json.loads((first / "metrics.jsonl").read_text().splitlines()[-1])["epsilon_max"] == spent


def test_a_run_diverged_beyond_1e6_is_left_out_of_the_cell_mean(tmp_path):
    """A run that diverged with finite weights beyond +-1e6 ends with a finite accuracy of the diverged model
    (0.82 here, seed 1), which the cell's mean counts (n = 1), while a NaN-diverged run is left out (CellResult.n:
    "a diverged run's non-finite value is left out of it"); the report notes the divergence but averages it in."""
    root = tmp_path / "suites"
    (root / "div").mkdir(parents=True)
    (root / "div" / "suite.toml").write_text(
        '[suite]\nname = "div"\ndescription = "d"\nseeds = [1]\n'
        '[suite.overrides]\ndataset = "synthetic"\nnum-clients = 2\nsynthetic-dim = 5\nstrategy = "fedyogi"\n'
        f'yogi-lr = 6e5\nnum-rounds = 3\nstate-dir = "{tmp_path / "state"}"\n'
        '[[cell]]\nrow = "Y"\ncolumn = "C"\n')
    suite = load_suite("div", root=root)
    cell = suite.cells[0]
    client.node._local.clear()
    out_dir = tmp_path / "out" / "div"
    config = validate(cell.run_overrides(1, out_dir))
    run_dir = run_inprocess(config, console=Console(file=io.StringIO(), width=400))
    assert json.loads((run_dir / "summary.json").read_text())["diverged"]["round"] == 2
    (res,) = collect(suite, out_dir)
    assert any("diverged" in n for n in res.notes)
    assert res.n == 0, (res.values, res.mean)


def test_fedlap_server_training_that_diverges_ends_the_run_as_diverged(tmp_path, monkeypatch):
    """FedLAP-DP's own server step (training on the clients' sets) makes the model NaN. It used to be
    dropped with a log line: the round counted no failure, the run went on spending the clients' budget
    on rounds whose sets the server could not use, and summary.json read like a finished result."""
    import server.strategies.fedlap as fedlap

    def blows_up(model, sets, **kw):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        return 1, 0.0, float("nan")

    monkeypatch.setattr(fedlap, "train_on_sets", blows_up)
    out = run(tmp_path, strategy="fedlap", **{"fedlap-ipc": 1, "fedlap-dsa": False, "num-rounds": 3,
                                             "fedlap-real-batches": 1, "fedlap-image-lr": 0.1, "run-name": "f"})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"]["round"] == 1 and "NaN or inf" in summary["diverged"]["why"]
    assert summary["rounds"] == 1 and summary["final"]["accuracy"] is None
