"""Session 16's own diff, reviewed: checkpoint wall time, dp-accounting warnings in worker processes, report notes."""

import functools
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

# --- checkpoint wall_seconds -----------------------------------------------------------------------------


def test_a_checkpoint_whose_wall_seconds_does_not_fit_a_float_is_refused_by_name(tmp_path):
    """_check_structure accepts any int in [0, inf) -- a JSON integer of 400 digits passes `< math.inf` --
    and `resume` then calls float() on it: OverflowError escapes, naming neither the file nor the key
    (every other damaged value is a CheckpointError `checkpoint ... is corrupted: ...`)."""
    from test_checkpoint import resumable
    from test_checkpoint_journal import MODEL, parts, play

    from server.checkpoint import CheckpointError, Checkpointer, load_checkpoint, save_checkpoint

    cfg = resumable(tmp_path)
    checkpointer, (strategy, mirror, writer) = Checkpointer(cfg, lambda *_: None), parts(cfg)
    play(checkpointer, strategy, mirror, writer, 1)
    save_checkpoint(checkpointer.path, {**load_checkpoint(checkpointer.path), "wall_seconds": 10**400})
    with pytest.raises(CheckpointError, match="wall_seconds"):
        Checkpointer(cfg, lambda *_: None).resume(*parts(cfg), MODEL)


def test_rerunning_a_finished_checkpointed_run_does_not_add_the_reruns_own_time(tmp_path, one_torch_thread,
                                                                               monkeypatch):
    """With checkpoint = true, the same command again "resumes" the finished run, runs no round and rewrites
    summary.json with wall_seconds = the checkpoint's figure + this no-op process's time (enrolment, data,
    initial evaluation; in a deployment, the wait for the nodes). Every re-run grows the finished run's wall
    time: measured first 0.04 s, re-run with a 2 s set-up 2.05 s. A segment that runs no round adds nothing."""
    from common.config import validate
    import server.runner
    from server.inprocess import run_inprocess

    cfg = validate({"num-clients": 2, "num-rounds": 2, "local-epochs": 1, "checkpoint": True,
                    "run-name": "ck", "results-dir": str(tmp_path / "results")})
    out = run_inprocess(cfg)
    first = json.loads((out / "summary.json").read_text())["wall_seconds"]
    slow_set_up = server.runner.load_test_set

    def slow(*args, **kwargs):
        time.sleep(2.0)
        return slow_set_up(*args, **kwargs)
    monkeypatch.setattr(server.runner, "load_test_set", slow)
    run_inprocess(cfg)
    again = json.loads((out / "summary.json").read_text())["wall_seconds"]
    assert again < first + 1.0, (first, again)


# --- dp-accounting's warnings in worker processes ----------------------------------------------------------

def _warnings_of_a_worker(capfd, initializer, initargs=()):
    """What a spawned worker prints while it computes an epsilon whose fractional orders do not converge
    (q = 0.2, sigma = 1: `_compute_log_a_frac failed to converge` at alpha 1.1 ... 1.7)."""
    from common.privacy import accounting

    capfd.readouterr()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=initializer,
                             initargs=initargs) as pool:
        eps = pool.submit(functools.partial(accounting.dpsgd_epsilon, 0.2, 1.0, 3, 1e-5)).result(timeout=120)
    assert 0 < eps < 100
    return capfd.readouterr().err


def test_run_with_client_workers_silences_dp_accountings_convergence_warnings(capfd):
    """cli/main.py `quiet_absl` ("silenced for every command") sets absl's verbosity in the CLI's process
    only; `privfed run --workers 2` runs the ClientApps in spawned processes (server/inprocess_grid.py
    `_worker_init`), which start with absl at WARNING. Measured: `privfed run default --set privacy="dpsgd"
    --set local-steps=3 --set dp-sample-rate=0.2 --set dp-noise-multiplier=1.0 ... --workers 2 --quiet` prints
    14 `WARNING:_compute_log_a_frac failed to converge` lines above its table; --workers 1 prints none."""
    from server.inprocess_grid import _worker_init

    err = _warnings_of_a_worker(capfd, _worker_init, ("client.app:app", {}, 1))
    assert "_compute_log_a_frac" not in err, err[:500]


def test_repro_job_workers_silence_dp_accountings_convergence_warnings(capfd):
    """The same for `privfed repro --jobs N`: each job runs a whole federation (server mirror and clients)
    in a spawned worker (cli/repro.py `_worker_init`), where absl is at WARNING again."""
    from cli.repro import _worker_init

    err = _warnings_of_a_worker(capfd, _worker_init)
    assert "_compute_log_a_frac" not in err, err[:500]


# --- report notes ----------------------------------------------------------------------------------------

def test_report_epsilon_notes_tell_apart_runs_of_the_same_name_in_different_folders():
    """`privfed report a b` lists each run by its full path, but the notes name runs by their folder's last
    component only: two runs with the same run-name (`--set run-name="x"` in two results-dirs) under different
    notes print "x: note A" and "x: note B", and the reader cannot tell which run each note is about."""
    from rich.console import Console

    from cli.run import print_epsilon_notes

    console = Console(record=True, width=400)
    print_epsilon_notes(console, [{"path": "/r/a/x", "epsilon_note": "note A"},
                                  {"path": "/r/b/x", "epsilon_note": "note B"}])
    lines = console.export_text().strip().splitlines()
    labels = [line.split(": ")[0] for line in lines]
    assert len(lines) == 2 and len(set(labels)) == 2, lines
