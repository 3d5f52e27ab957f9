"""Review of the session-13 changes (privacy ledger v2, process hygiene, smaller fixes): each test fails
on the code as reviewed and states the behaviour a fix must give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger

REPO = Path(__file__).resolve().parents[1]

DELTA = 1e-5


# --- the privacy ledger ------------------------------------------------------------------------------
def test_a_ledger_made_in_memory_and_recorded_to_an_existing_file_loses_no_entry(tmp_path):
    """`PrivacyLedger(entries, path=p)` with p an existing ledger file: its first `record` re-reads the file
    and silently drops the entries the object held (they were never written), so the object's epsilon
    *falls* across a charge. Either keep every entry (file's and object's) or refuse; never lose one."""
    path = tmp_path / "partition-0.ledger.json"
    on_disk = PrivacyLedger.open(path, owner="partition-0")
    on_disk.record(dpsgd_steps(0.01, 1.0, 10, round=1))
    file_bytes = path.read_bytes()

    mine = PrivacyLedger([dpsgd_steps(0.01, 1.0, 500, round=1)], owner="partition-0", path=path)
    before = mine.epsilon(DELTA)
    new = dpsgd_steps(0.01, 1.0, 5, round=2)
    try:
        mine.record(new)
    except ValueError:  # a refusal is acceptable: the file must then be untouched
        assert path.read_bytes() == file_bytes
        return
    # measured: mine.steps() == 15 after the record (the 500 dropped), epsilon 1.653 -> 1.055
    assert mine.epsilon(DELTA) >= before, "recording an entry lowered the ledger's epsilon"
    assert mine.steps() >= 500 + 5
    assert PrivacyLedger.load(path).steps() >= 500 + 5


# --- the run-folder hold -----------------------------------------------------------------------------
def test_a_repro_job_leaves_the_files_of_a_run_folder_held_by_a_run_still_going(tmp_path):
    """`privfed repro` redoes every run without summary.json, i.e. also one another `privfed repro` (or
    `privfed run`) is running right now; `run_job` deletes that run's metrics.jsonl and summary.json and
    truncates its log.txt *before* the runner's `hold_run_folder` refuses the folder as in use."""
    from cli.repro import run_job

    run_dir = tmp_path / "res" / "held"
    overrides = {"dataset": "synthetic", "num-clients": 2, "num-rounds": 1, "results-dir": str(tmp_path / "res"),
                 "run-name": "held"}
    holder = subprocess.Popen(  # the run still going, in another process
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from server.results import "
         "hold_run_folder\nwith hold_run_folder(Path(sys.argv[1])):\n print('held', flush=True); time.sleep(60)",
         str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rows = '{"round": 1, "accuracy": 0.5}\n{"round": 2, "accuracy": 0.6}\n'
        (run_dir / "metrics.jsonl").write_text(rows)
        (run_dir / "log.txt").write_text("privfed: round 2 ...\n")
        with pytest.raises(Exception, match="in use"):
            run_job(dict(overrides))
        # measured: metrics.jsonl deleted, log.txt emptied; the first run then goes on writing from round 3
        assert (run_dir / "metrics.jsonl").exists(), "the running run's metrics.jsonl was deleted"
        assert (run_dir / "metrics.jsonl").read_text() == rows
        assert (run_dir / "log.txt").read_text() == "privfed: round 2 ...\n"
    finally:
        holder.kill()
        holder.wait()


# --- accuracy-at-epsilon -----------------------------------------------------------------------------
def test_fedlap_table2_quick_cells_that_spend_the_papers_epsilon_carry_no_never_reached_note():
    """The quick fedlap-table2 profile ends at epsilon 2.7866 after its 4 rounds (README: 1.887, 2.232,
    2.524, 2.787), exactly the paper's "2.79". With metric-param = 2.795 (the top of the rounding interval)
    `_accuracy_at_epsilon` adds "epsilon never reached 2.795 (max 2.787)" to every cell's report notes,
    telling the reader the cell was read below the paper's budget when it was read at it (with 2.786 the
    report had no such note)."""
    from server.report import METRICS, load_suite

    suite = load_suite("fedlap-table2")
    rows = [{"round": r, "accuracy": 0.1 * r, "epsilon_max": e}
            for r, e in enumerate([1.887, 2.232, 2.524, 2.7866439426422334], start=1)]
    value, note = METRICS[suite.metric].fn(rows, {}, suite.metric_param)
    assert value == pytest.approx(0.4)
    assert note is None, note
