"""Storage faults (review): a disk that fills up or fails (ENOSPC, EIO) while privfed writes its state.

Faults are injected per file: `os.fsync` fails for the file descriptors whose path (/proc/self/fd) ends
with a given name, or a module's writer is replaced by one that fails as a full disk does."""

from __future__ import annotations

import errno
import json
import os
import textwrap
from pathlib import Path

import pytest

import client.node
from cli.main import main
from client.privacy import ledger_path
from common.config import validate
from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger

BASE = {"num-clients": 2, "synthetic-dim": 10, "privacy": "dpsgd", "local-steps": 1, "dp-sample-rate": 0.2,
        "dp-noise-multiplier": 1.0, "dp-clip": 1.0, "target-epsilon": 50.0, "target-delta": 1e-5}


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def fail_fsync(monkeypatch, suffix: str, nth: int = 1, code: int = errno.EIO, dirs: bool = False,
               temps: bool = True) -> list[int]:
    """os.fsync raises OSError(code) at the nth call on a file whose path ends with `suffix` (`temps`: or on
    a temp file named after it, written before a rename); `dirs`: on directories instead."""
    real, calls = os.fsync, []

    def fsync(fd):
        path = _fd_path(fd)
        hit = os.path.isdir(path) if dirs else (path.endswith(suffix) or (temps and suffix in path and path.endswith(".tmp")))
        if hit:
            calls.append(fd)
            if len(calls) == nth:
                raise OSError(code, os.strerror(code))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def run_cli(capsys, results, *sets, rounds=3, name="r", checkpoint=True):
    argv = ["run", "default", "--results-dir", str(results), "--quiet", "--threads", "1",
            "--set", f"num-rounds={rounds}", "--set", f"run-name={name}", "--set", f"checkpoint={str(checkpoint).lower()}"]
    for k, v in BASE.items():
        argv += ["--set", f"{k}={v}"]
    for s in sets:
        argv += ["--set", s]
    client.node._local.clear()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> bool:
    return "Traceback" not in err and len(err.strip().splitlines()) == 1


# --- 1. the CLI's error names the file that could not be written ---------------------------------------------
@pytest.mark.parametrize("suffix", ["r.ckpt.npz", "r.journal.jsonl", "r.inflight.npz"])
def test_a_failed_checkpoint_write_stops_the_run_with_an_error_naming_the_file(capsys, tmp_path, suffix,
                                                                              one_torch_thread, monkeypatch):
    """fsync of the checkpoint (or its journal, or its in-flight record) fails with EIO in round 2: the run
    stops (exit 1), in one line, but the line is `OSError: [Errno 5] Input/output error`: the user is not
    told which file (which disk) failed. It must name it."""
    calls = fail_fsync(monkeypatch, suffix, nth=2)
    code, _, err = run_cli(capsys, tmp_path)
    assert len(calls) == 2, calls  # the fault did fire
    assert code == 1 and one_line(err), err
    assert suffix in err, err  # measured: "privfed run: error: OSError: [Errno 5] Input/output error (...)"


def test_guard_a_failed_checkpoint_save_keeps_the_previous_one_and_the_resume_counts_the_round(
        capsys, tmp_path, one_torch_thread, monkeypatch):
    """Guard (passes): round 2's checkpoint save fails (EIO); round 1's checkpoint is intact, and the resume
    counts round 2 through the in-flight record: every partition's reported epsilon equals its ledger's."""
    fail_fsync(monkeypatch, "r.ckpt.npz", nth=2)
    assert run_cli(capsys, tmp_path)[0] == 1
    monkeypatch.undo()
    code, _, err = run_cli(capsys, tmp_path)
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for p in (0, 1):
        ledger = PrivacyLedger.load(tmp_path / "node-state" / "name-r" / f"partition-{p}.ledger.json")
        assert summary["privacy"]["ledgers"][str(p)]["entries"] == len(ledger) == 4  # round 2 counted twice


def test_a_node_whose_ledger_cannot_be_written_is_named_in_the_runs_error(capsys, tmp_path, one_torch_thread,
                                                                         monkeypatch):
    """Every node's charge fails (its ledger's fsync raises ENOSPC): no round updates the model and the run
    fails with "no round updated the model; clients failed: <class 'OSError'>:<'[Errno 28] No space left
    on device'>". The data owner is not told that it is the privacy ledger (which file) that cannot be
    written; it must be named."""
    real = os.fsync

    def fsync(fd):
        if _fd_path(fd).endswith(".ledger.json"):  # every append of a charge (the creation is a .tmp: allowed)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code, _, err = run_cli(capsys, tmp_path, rounds=1, checkpoint=False)
    assert code == 1 and one_line(err), err
    assert "No space left" in err, err
    assert ".ledger.json" in err, err  # measured: no file named


# --- 2. a charge that failed to persist: the node's ledger and the server's report agree -----------------------
def test_server_never_reports_less_than_a_node_ledger_after_a_charge_whose_fsync_failed(
        capsys, tmp_path, one_torch_thread, monkeypatch):
    """Partition 1's round-1 charge: its line is written, then fsync fails (EIO). `record` raises, the node
    replies with an error, the server counts nothing for it (nothing was released), and the run goes on
    and exits 0. But the line stays in the ledger file: on every later load the node counts it. Measured:
    summary.json says partition 1 spent epsilon 3.454 (2 entries); its ledger says 3.886 (3 entries).
    The server reports an epsilon lower than the node's ledger, and the node will refuse a round earlier
    than the server plans. A record that raised must leave the ledger as it was (truncate back to the end
    of the last complete record), or the server must count the round."""
    calls = fail_fsync(monkeypatch, "partition-1.ledger.json", nth=1, temps=False)  # round 1's append
    code, _, err = run_cli(capsys, tmp_path, rounds=3, checkpoint=False)
    assert len(calls) >= 1 and code == 0, err
    run_dir = tmp_path / "r"
    summary = json.loads((run_dir / "summary.json").read_text())
    run_id = next((tmp_path / "node-state").glob("run-*")).name
    for p in (0, 1):
        ledger = PrivacyLedger.load(tmp_path / "node-state" / run_id / f"partition-{p}.ledger.json")
        reported = summary["privacy"]["ledgers"][str(p)]
        assert reported["epsilon"]["rdp"] >= ledger.epsilon(1e-5) - 1e-12, (p, reported, len(ledger))
        assert reported["entries"] == len(ledger), (p, reported["entries"], len(ledger))


def test_a_record_that_raised_leaves_no_charge_in_the_ledger(tmp_path, monkeypatch):
    """The unit form of the above: `record` appends, its fsync fails (EIO), it raises, and the caller
    (charge) refuses the round. The ledger must still hold what it held before (1 entry): measured, a
    reload and a fresh load both read 2."""
    path = tmp_path / "p.ledger.json"
    ledger = PrivacyLedger.open(path, owner="p")
    ledger.record(dpsgd_steps(0.1, 1.0, 5, round=1))
    fail_fsync(monkeypatch, "p.ledger.json", nth=1, temps=False)
    with pytest.raises(OSError):
        ledger.record(dpsgd_steps(0.1, 1.0, 5, round=2))
    monkeypatch.undo()
    ledger.reload()
    assert len(ledger) == 1 and len(PrivacyLedger.load(path)) == 1, (len(ledger), len(PrivacyLedger.load(path)))


# --- 3. a directory fsync that fails is not ignored -----------------------------------------------------------
def test_a_new_ledger_whose_directory_fsync_fails_with_eio_is_not_reported_durable(tmp_path, monkeypatch):
    """`PrivacyLedger.open` of a new ledger writes it whole and renames it into place, then fsyncs the folder
    (`fsync_dir`) so that the file itself survives a power loss: its later appends are fsynced in place,
    so a lost directory entry loses every charge, and the next start opens a fresh, empty ledger. When
    that fsync fails with EIO, `fsync_dir` swallows the error ("best effort") and `open` returns as if
    the ledger were durable. Only "not supported" errors (EINVAL, ENOTSUP) may be ignored; EIO must
    reach the caller (the node then refuses the round)."""
    fail_fsync(monkeypatch, "", nth=1, dirs=True)
    with pytest.raises(OSError):
        PrivacyLedger.open(tmp_path / "state" / "p.ledger.json", owner="p")


def test_a_checkpoint_whose_directory_fsync_fails_with_eio_stops_the_run(capsys, tmp_path, one_torch_thread,
                                                                          monkeypatch):
    """The same for the server: after renaming a round's checkpoint into place, the checkpoint folder's
    fsync fails with EIO; `fsync_dir` swallows it, `save` then deletes the in-flight record, and the run
    finishes with exit 0. After a power loss the rename may be lost while the deletion is not: the resume
    starts from the older checkpoint without counting the round its clients charged. The run must stop."""
    real, hits = os.fsync, []
    ckpt_dir = tmp_path / "checkpoints"

    def fsync(fd):
        if _fd_path(fd) == str(ckpt_dir):
            hits.append(fd)
            if len(hits) == 3:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code, _, err = run_cli(capsys, tmp_path, rounds=3)
    assert len(hits) >= 3
    assert code == 1 and one_line(err), (code, err)  # measured: exit 0


# --- 4. the report and repro commands: one line, and nothing lost ---------------------------------------------
SUITE = textwrap.dedent("""
    [suite]
    name = "tiny"
    description = "one cell, one seed"
    seeds = [1]
    [suite.overrides]
    num-clients = 2
    num-rounds = 1
    synthetic-dim = 10
    [[cell]]
    row = "FedAvg"
    column = "Syn"
""")


def test_repro_whose_report_cannot_be_written_fails_in_one_line(capsys, tmp_path, one_torch_thread, monkeypatch):
    """`privfed repro` runs its suite, then writes timing.json and report.md outside any error handling:
    a full disk there (ENOSPC) escapes as a raw exception (a traceback from the `privfed` entry point).
    It must be a one-line error naming the file, like every other write failure of the command."""
    import server.report

    folder = tmp_path / "suites" / "tiny"
    folder.mkdir(parents=True)
    (folder / "suite.toml").write_text(SUITE)

    def full(suite_dir, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(suite_dir) / "timing.json"))

    monkeypatch.setattr(server.report, "write_timing", full)
    client.node._local.clear()
    try:
        code = main(["repro", str(folder), "--out", str(tmp_path / "out"), "--no-plots"])
    except OSError as exc:  # measured: OSError [Errno 28] No space left on device: '.../timing.json'
        pytest.fail(f"privfed repro raised {exc!r} instead of a one-line error")
    _, err = capsys.readouterr()
    assert code != 0 and one_line(err) and str(tmp_path / "out") in err, err


def test_report_of_a_run_whose_plot_cannot_be_written_fails_in_one_line(capsys, tmp_path, monkeypatch):
    """`privfed report RUN` redraws accuracy.png outside its try: a full (or read-only) disk escapes as a raw
    OSError. It must skip or fail that run in one line, as it does for an unreadable summary."""
    import server.results

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"config": {"strategy": "fedavg", "dataset": "synthetic", "seed": 0},
                                                  "final": {"accuracy": 0.5, "loss": 1.0, "round": 1}, "rounds": 1,
                                                  "wall_seconds": 1.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.5, "loss": 1.0}) + "\n")

    def full(rows, path, title):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(server.results, "plot_accuracy", full)
    try:
        main(["report", str(run)])
    except OSError as exc:
        pytest.fail(f"privfed report raised {exc!r} instead of a one-line error")
    _, err = capsys.readouterr()
    assert str(run) in err and "No space left" in err, err


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (root only; skipped elsewhere), unmounted afterwards."""
    import subprocess

    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path, leave: int = 0) -> None:
    """Take all the free space of `folder`'s filesystem but `leave` bytes (whole pages)."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    (folder / "filler").write_bytes(b"x" * max(0, free - leave))
    assert os.statvfs(folder).f_bavail * st.f_frsize == leave


def test_a_failed_timing_write_keeps_the_earlier_invocations(small_disk):
    """timing.json is rewritten in place (`Path.write_text`: truncate, then write). A disk that fills
    during the write leaves a cut file, and the next `write_timing` reads it as no history at all
    (`read_timing` returns [] on a JSONDecodeError) and writes only its own invocation: every earlier
    invocation's timing is gone (measured: 1 invocation left of 26). It must be written atomically
    (temp file, rename), so that a failed write leaves the old file."""
    from server.report import read_timing, write_timing

    for i in range(40):  # a history just under one page (4096 bytes): the next one needs a second page
        write_timing(small_disk, float(i), 1, 0, 0, 1)
        if (small_disk / "timing.json").stat().st_size > 4096 - 160:
            break
    before = read_timing(small_disk)
    fill(small_disk)
    with pytest.raises(OSError):
        write_timing(small_disk, 99.0, 1, 0, 0, 1)
    (small_disk / "filler").unlink()
    write_timing(small_disk, 100.0, 1, 0, 0, 1)
    walls = [i["wall_seconds"] for i in read_timing(small_disk)]
    assert walls[:len(before)] == [i["wall_seconds"] for i in before], (len(before), walls)


def test_a_failed_summary_write_leaves_no_cut_summary(small_disk):
    """summary.json "marks a finished run" (runner, repro, report; `holds_run`) and is written in place: a
    full disk leaves an empty or cut, unparseable summary.json that still marks the folder as holding a
    finished run. It must be written atomically: a failed write leaves no summary.json (or the old one)."""
    from server.results import ResultsWriter

    writer = ResultsWriter(small_disk, "run")
    fill(small_disk)
    with pytest.raises(OSError):
        writer.write_summary({"config": {}, "final": {"accuracy": 0.5}, "x": "y" * 5000})
    path = small_disk / "run" / "summary.json"
    assert not path.exists(), repr(path.read_text()[:80])  # measured: an empty summary.json
