"""`privfed repro` (cli/repro.py) and the suite machinery (server/report.py) over days: interrupted, resumed,
a worker killed, two commands on one --out (an adversarial review, session 20: each test failed on the code
it reviewed)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import textwrap
import threading
import time

import pytest

import cli.repro as repro_mod
from cli.main import main

SUITE = textwrap.dedent("""
    [suite]
    name = "rr"
    seeds = [1]
    scale = 100.0
    [suite.overrides]
    num-clients = 3
    num-rounds = 2
    [[cell]]
    row = "FedAvg"
    column = "Syn"
    overrides = { synthetic-alpha = 0.0, synthetic-beta = 0.0 }
""")


def _suite(tmp_path, text=SUITE):
    folder = tmp_path / "suites" / "rr"
    folder.mkdir(parents=True)
    (folder / "suite.toml").write_text(text)
    return folder


def test_a_second_repro_on_the_same_out_does_not_delete_a_run_the_first_finished(tmp_path, monkeypatch, capsys):
    """Two `privfed repro` on one --out: B plans while A's run s1 is under way (no summary.json yet), so
    s1 is in B's todo. A finishes s1; B then takes the free lock, deletes A's finished summary.json and
    metrics.jsonl (run_job) and runs s1 again. Observed for real with two shells: both commands executed
    all 6 runs of a 6-run suite. Here B is Ctrl-C'd in that rerun: A's finished result is gone.
    run_job should re-check run_is_finished once it holds the folder, and skip a run finished meanwhile."""
    suite = _suite(tmp_path)
    out = tmp_path / "out"
    run_dir = out / "rr" / "FedAvg__Syn" / "s1"
    real_preflight = repro_mod._preflight
    calls = {"n": 0}

    def preflight_then_command_a_finishes(todo):  # between B's plan and B's runs, command A finishes s1
        real_preflight(todo)
        calls["n"] += 1
        if calls["n"] == 1:
            assert main(["repro", str(suite), "--out", str(out), "--no-plots"]) == 0
            assert (run_dir / "summary.json").is_file()
            import server.inprocess

            def interrupted(*a, **k):  # B is then Ctrl-C'd during its (needless) rerun of s1
                raise KeyboardInterrupt
            monkeypatch.setattr(server.inprocess, "run_inprocess", interrupted)

    monkeypatch.setattr(repro_mod, "_preflight", preflight_then_command_a_finishes)
    try:  # fixed: B finds s1 finished once it holds the folder, skips it and returns normally
        main(["repro", str(suite), "--out", str(out), "--no-plots"])
    except KeyboardInterrupt:
        pass
    capsys.readouterr()
    assert (run_dir / "summary.json").is_file(), "command B deleted the run command A had finished"


def _fake_run_job(overrides, threads=1):
    """Stands in for a run in a (forked) worker: seed 1's worker is SIGKILLed (the OOM killer) at once;
    the others take 0.5 s and leave a marker."""
    from pathlib import Path

    run_dir = Path(overrides["results-dir"]) / overrides["run-name"]
    run_dir.mkdir(parents=True, exist_ok=True)
    if overrides["seed"] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    (run_dir / "ran").write_text("ok")
    return str(run_dir), 0.5


def test_one_killed_worker_does_not_fail_every_other_run(tmp_path, monkeypatch, capsys):
    """--jobs 2, and one worker is SIGKILLed (the OOM killer): the pool breaks, every run in flight or
    queued fails with BrokenProcessPool and the other worker is killed too. Observed for real (6 runs of
    60 rounds, one worker killed by hand): '0 run(s) executed, 0 skipped, 6 failed', the other worker's
    nearly finished run lost. Only the killed run should fail; the others should run (a fresh pool for
    what is left). Workers are forked here (not spawned) so that they run the stand-in run_job quickly."""
    text = SUITE.replace("seeds = [1]", "seeds = [1, 2, 3, 4]")
    suite = _suite(tmp_path, text)
    out = tmp_path / "out"
    fork = multiprocessing.get_context("fork")
    monkeypatch.setattr(repro_mod, "run_job", _fake_run_job)
    monkeypatch.setattr(repro_mod.multiprocessing, "get_context", lambda method=None: fork)
    code = main(["repro", str(suite), "--out", str(out), "--no-plots", "--jobs", "2"])
    _, err = capsys.readouterr()
    ran = sorted(p.parent.name for p in (out / "rr" / "FedAvg__Syn").glob("s*/ran"))
    assert code == 1
    assert err.count("run failed:") == 1 and ran == ["s2", "s3", "s4"], (ran, err[-400:])


def test_a_metrics_file_cut_at_a_line_boundary_is_not_read_as_the_final_accuracy(tmp_path):
    """A finished run (summary.json: 2 rounds, final accuracy 0.9) whose metrics.jsonl lost its last line
    (an interrupted copy of the suite folder; `collect` already refuses one cut mid-line): collect takes
    rows[-1], round 1's 0.5, as the run's final accuracy and the report shows 50.00 ± 0.00 over n = 1,
    silently. It should notice rows[-1]['round'] != summary['rounds'] and leave the run out (noted), or
    use summary['final']."""
    import csv
    import json

    from server.report import expected_config, load_suite, render_report

    suite = load_suite(str(_suite(tmp_path)))
    cell = suite.cells[0]
    run = tmp_path / "out" / "rr" / cell.folder / "s1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"config": expected_config(cell, 1), "rounds": 2,
                                                  "planned_rounds": 2,
                                                  "final": {"round": 2, "accuracy": 0.9, "loss": 0.3}}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.5, "loss": 1.0}) + "\n")
    render_report(run.parents[1], suite, plots=False)
    with (run.parents[1] / "report.csv").open() as fh:
        row = next(csv.DictReader(fh))
    assert row["ours_mean"] in ("", "90.0000"), row


def test_a_full_disk_at_suite_start_keeps_the_earlier_suite_json(tmp_path):
    """write_snapshot writes suite.json in place (Path.write_text): a disk that fills while it writes
    leaves a truncated suite.json, and `privfed report` then skips the suite ('unreadable suite.json')
    though every run is there. write_timing beside it is atomic ("a full disk keeps the earlier history");
    suite.json should be written the same way (common.durable.write_atomically). The full disk is
    RLIMIT_FSIZE here (writes past 64 bytes fail with EFBIG)."""
    import resource

    from server.report import load_suite, read_snapshot, write_snapshot

    suite = load_suite(str(_suite(tmp_path)))
    suite_dir = tmp_path / "out" / "rr"
    write_snapshot(suite, suite_dir)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, old_limit[1]))
    try:
        with pytest.raises(OSError):
            write_snapshot(suite, suite_dir)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert read_snapshot(suite_dir) == suite


def test_a_run_held_by_another_repro_is_not_reported_as_a_config_error_to_rename(tmp_path, capsys):
    """Two `privfed repro` on one --out: the run the other command holds (.running flocked) is reported
    as 'run failed: ... ConfigError: results folder ... is in use by a run still going; choose another
    run-name' and the command exits 1. A suite's run-names are the suite's (s<seed>), so the advice cannot be
    followed; the message should say another command is running this run (it is not a failure of the
    run, and it is neither counted nor lost)."""
    import fcntl

    suite = _suite(tmp_path)
    out = tmp_path / "out"
    run_dir = out / "rr" / "FedAvg__Syn" / "s1"
    run_dir.mkdir(parents=True)
    with open(run_dir / ".running", "a") as held:  # the other command's worker holds s1
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        main(["repro", str(suite), "--out", str(out), "--no-plots"])
    _, err = capsys.readouterr()
    assert "choose another run-name" not in err, err


def test_a_suite_refuses_checkpointing_its_runs(tmp_path):
    """With checkpoint = true an edited cell's stale run resumed the old checkpoint and was refused on every
    invocation (its results deleted each time), and cells sharing a state-dir mixed their s<seed> ledgers
    (LedgerOfAnotherStart): a review, session 20."""
    from common.config import ConfigError
    from server.report import load_suite

    with pytest.raises(ConfigError, match="checkpoint = true is for single runs"):
        load_suite(str(_suite(tmp_path, SUITE.replace("num-rounds = 2", "num-rounds = 2\ncheckpoint = true"))))


def test_the_progress_bar_says_how_many_runs_failed(tmp_path, monkeypatch, capsys):
    """The bar counts runs ended: with every run failed it read 'runs ... 2/2' like a suite done."""
    def fails(overrides):
        raise RuntimeError("boom")

    monkeypatch.setattr(repro_mod, "run_job", fails)
    suite = _suite(tmp_path, SUITE.replace("seeds = [1]", "seeds = [1, 2]"))
    code = main(["repro", str(suite), "--out", str(tmp_path / "out"), "--no-plots"])
    out, _ = capsys.readouterr()
    assert code == 1 and "runs (2 failed)" in out, out[-600:]


def test_a_finished_seed_left_out_of_the_report_is_noted(tmp_path):
    """`privfed repro --seeds 3` on a 1-seed suite, then `privfed repro` again: the snapshot is the suite's
    seeds, and seeds 2 and 3 left the report silently (n = 1, no word of the other finished runs)."""
    import json

    from server.report import collect, expected_config, load_suite

    suite = load_suite(str(_suite(tmp_path)))
    cell = suite.cells[0]
    for seed in (1, 3):
        run = tmp_path / "out" / "rr" / cell.folder / f"s{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"config": expected_config(cell, seed), "rounds": 1,
                                                      "planned_rounds": 1,
                                                      "final": {"round": 1, "accuracy": 0.9, "loss": 0.3}}))
        (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.9, "loss": 0.3}) + "\n")
    (res,) = collect(suite, tmp_path / "out" / "rr")
    assert res.seeds == [1]
    assert any(n.startswith("seed 3: a finished run, but not one of the suite's seeds now (1)") for n in res.notes)


def test_an_interrupted_invocation_counts_in_the_suite_wall_time(tmp_path, monkeypatch):
    """Ctrl-C after one of two runs: timing.json got nothing, so the report's total wall time left out the
    time of the run finished before it (a later invocation skips that run)."""
    import json

    calls = []

    def one_then_ctrl_c(overrides):
        calls.append(overrides["seed"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        run_dir = tmp_path / "fake" / str(overrides["seed"])
        run_dir.mkdir(parents=True)
        return str(run_dir), 0.1

    monkeypatch.setattr(repro_mod, "run_job", one_then_ctrl_c)
    suite = _suite(tmp_path, SUITE.replace("seeds = [1]", "seeds = [1, 2]"))
    with pytest.raises(KeyboardInterrupt):
        main(["repro", str(suite), "--out", str(tmp_path / "out"), "--no-plots"])
    (timing,) = json.loads((tmp_path / "out" / "rr" / "timing.json").read_text())["invocations"]
    assert timing["interrupted"] is True and timing["executed"] == 1 and timing["wall_seconds"] > 0


def test_a_missing_data_file_names_the_cells_that_need_it(tmp_path, monkeypatch, capsys):
    """One missing file refuses the suite before any run (a clear error); it now says which cells need it,
    so that --filter can run the others."""
    monkeypatch.setenv("PRIVFED_DATA_DIR", str(tmp_path / "no-data"))
    suite = _suite(tmp_path, SUITE.replace("overrides = { synthetic-alpha = 0.0, synthetic-beta = 0.0 }",
                                           'overrides = { dataset = "syn-iid", num-clients = 30 }'))
    code = main(["repro", str(suite), "--out", str(tmp_path / "out"), "--no-plots"])
    _, err = capsys.readouterr()
    assert code == 2 and "cell(s) FedAvg / Syn (--filter runs the others)" in err and "syn_iid.npz" in err, err
