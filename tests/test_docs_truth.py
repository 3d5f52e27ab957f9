"""The user docs tell the truth (from an adversarial review of README.md, docs/ and the CLI's help): each
test runs what a document promises, with small settings, and checks the documented behaviour."""

from __future__ import annotations

import json
from pathlib import Path

from cli.main import main
from cli.run import read_summary
from common.privacy.ledger import PrivacyLedger


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_table_rounds_counts_the_rounds_a_budget_stopped_run_ran(capsys, tmp_path, one_torch_thread):
    """README (Privacy): a client refuses training past `target-epsilon`, "the server then stops selecting
    it and ends the run when no client can train". `privfed run`'s final table (and `privfed report`'s)
    has a `rounds` column: it must say how many rounds the run ran, not the configured num-rounds."""
    code, out, err = _run(capsys, "run", "default", "--set", "num-rounds=5", "--set", "privacy=dpsgd",
                          "--set", "local-steps=3", "--set", "dp-sample-rate=0.1", "--set", "target-epsilon=3.2",
                          "--set", "run-name=budget", "--results-dir", str(tmp_path), "--quiet")
    assert code == 0, err
    run_dir = tmp_path / "budget"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(rows) == 3 and summary["final"]["round"] == 3  # the budget ended the run after round 3 of 5
    assert read_summary(run_dir)["rounds"] == 3, (
        f"the run table's `rounds` says {read_summary(run_dir)['rounds']} for a run that ended after round 3")


def test_upcycled_ledgers_hold_odd_rounds_only_as_the_privacy_table_says(capsys, tmp_path, one_torch_thread):
    """README (Privacy table): Upcycled even rounds touch no client and leave no entry; the node's ledger
    and the server's mirror hold the odd rounds' releases only."""
    code, out, err = _run(capsys, "run", "default", "--set", "upcycled=true", "--set", "num-rounds=4",
                          "--set", "privacy=output", "--set", "run-name=up", "--results-dir", str(tmp_path),
                          "--quiet")
    assert code == 0, err
    (ledger,) = sorted((tmp_path / "node-state").glob("run-*/partition-0.ledger.json"))
    assert [e.round for e in PrivacyLedger.load(ledger).entries] == [1, 3]
    assert json.loads((tmp_path / "up" / "summary.json").read_text())["privacy"]["ledgers"]["0"]["entries"] == 2
    assert "Upcycled even rounds touch no client and leave no entry" in README.read_text()


README = Path(__file__).resolve().parents[1] / "README.md"
_PRIVATE_CKPT = ("default", "--set", "checkpoint=true", "--set", "num-rounds=2", "--set", "privacy=dpsgd",
                 "--set", "local-steps=3", "--set", "dp-sample-rate=0.1", "--set", "run-name=ckp", "--quiet")


def test_a_fresh_start_under_a_checkpointed_run_name_is_refused_as_the_readme_says(
        capsys, tmp_path, one_torch_thread):
    """README (Results): with `checkpoint = true` the run-name names the run to resume; a fresh start needs
    another run-name. Its checkpoint deleted, the same run-name is refused (the results folder holds a run)."""
    code, _, err = _run(capsys, "run", *_PRIVATE_CKPT, "--results-dir", str(tmp_path))
    assert code == 0, err
    (tmp_path / "checkpoints" / "ckp.ckpt.npz").unlink()
    code, _, err = _run(capsys, "run", *_PRIVATE_CKPT, "--results-dir", str(tmp_path))
    assert code != 0 and "already holds a run" in err
    assert "A fresh start needs\nanother run-name" in README.read_text()


def test_fresh_start_under_a_checkpointed_run_name_reports_the_nodes_epsilon(capsys, tmp_path, one_torch_thread):
    """Checkpoint and results folder both deleted: the nodes' ledgers are keyed by the run-name
    (client/privacy.py ledger_path: name-<run-name>) and keep the first start's charges, while the new
    server's mirror starts empty. The run's reported epsilon must not understate what the nodes' own
    ledgers hold: the nodes refuse the new start (client/privacy.py `claim`)."""
    code, _, err = _run(capsys, "run", *_PRIVATE_CKPT, "--results-dir", str(tmp_path))
    assert code == 0, err
    (tmp_path / "checkpoints" / "ckp.ckpt.npz").unlink()
    for name in ("metrics.jsonl", "summary.json", "model.npz", "accuracy.png", "accuracy_vs_epsilon.png"):
        (tmp_path / "ckp" / name).unlink(missing_ok=True)
    held = len(PrivacyLedger.load(tmp_path / "node-state" / "name-ckp" / "partition-0.ledger.json").entries)
    code, _, err = _run(capsys, "run", *_PRIVATE_CKPT, "--results-dir", str(tmp_path))
    assert code != 0 and "charged by an earlier start of run-name 'ckp'" in err and "another run-name" in err
    ledger = PrivacyLedger.load(tmp_path / "node-state" / "name-ckp" / "partition-0.ledger.json")
    assert len(ledger.entries) == held  # refused before any charge
