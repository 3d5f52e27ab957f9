"""Process hygiene of every way privfed runs: what an ending (SIGTERM, SIGINT, a timeout, two runs at once)
leaves behind. Each test starts privfed in a session of its own (start_new_session) and, whatever happens,
kills exactly that process group (and any process carrying the test's private FLWR_HOME) at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# a run that lasts far longer than any test: it is always ended by a signal
ENDLESS = ["--set", "dataset=synthetic", "--set", "num-clients=4", "--set", "num-rounds=100000",
           "--set", "fraction-train=1.0"]


def child_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, FLWR_DISABLE_UPDATE_CHECK="1", FLWR_TELEMETRY_ENABLED="0",
               PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    env.pop("PRIVFED_DEBUG", None)
    return env


def start(argv: list[str], tmp_path: Path, name: str = "out") -> subprocess.Popen:
    """privfed ARGV in a new session (its own process group); SIGINT at its default, as on a terminal."""
    def pre():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    log = open(tmp_path / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "cli.main", *argv], cwd=REPO, env=child_env(tmp_path),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pre)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def with_env_prefix(prefix: str) -> list[int]:
    """Live processes whose FLWR_HOME lies under `prefix`."""
    needle = f"FLWR_HOME={prefix}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(v.startswith(needle) for v in (entry / "environ").read_bytes().split(b"\0")):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_all(pgid: int, extra: list[int] = ()) -> None:
    """Clean-up: the test's own process group and the given pids, by id."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in extra:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def has_rows(path: Path, n: int = 1) -> bool:
    try:
        return len(path.read_text().splitlines()) >= n
    except OSError:
        return False


def survivors_after_exit(proc: subprocess.Popen, timeout: float = 15) -> tuple[int | None, list[int]]:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    time.sleep(1.0)
    return code, group_members(proc.pid)


# --- privfed run --engine inprocess --workers N --------------------------------------------------------
def test_sigterm_to_inprocess_run_with_workers_leaves_no_worker_processes(tmp_path):
    results = tmp_path / "results"
    proc = start(["run", "default", *ENDLESS, "--set", "run-name=w", "--results-dir", str(results),
                  "--workers", "2", "--quiet"], tmp_path)
    try:
        wait_for(lambda: has_rows(results / "w" / "metrics.jsonl"), 40, "the first round")
        workers = [p for p in group_members(proc.pid) if p != proc.pid]
        assert workers, "expected worker processes while the run is going"
        proc.send_signal(signal.SIGTERM)
        code, left = survivors_after_exit(proc)
        assert code is not None, "privfed did not end after SIGTERM"
        # measured: 3 processes (2 spawn workers + the resource tracker), re-parented to init, still there
        # 24 s later, the workers blocked forever on their call queue
        assert left == [], f"SIGTERM left {len(left)} process(es) of the run behind: {left}"
    finally:
        kill_all(proc.pid)


def test_ctrl_c_on_inprocess_run_with_workers_prints_one_line_not_worker_tracebacks(tmp_path):
    results = tmp_path / "results"
    proc = start(["run", "default", *ENDLESS, "--set", "run-name=c", "--results-dir", str(results),
                  "--workers", "2", "--quiet"], tmp_path)
    try:
        wait_for(lambda: has_rows(results / "c" / "metrics.jsonl"), 40, "the first round")
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C on a terminal: the whole foreground group gets SIGINT
        code, left = survivors_after_exit(proc)
        output = (tmp_path / "out.log").read_text()
        assert code == 130 and left == []
        assert "privfed: interrupted" in output
        # measured: a 20-line "Process SpawnProcess-2: Traceback ... KeyboardInterrupt" from a worker
        assert "Traceback" not in output, output[-1500:]
    finally:
        kill_all(proc.pid)


# --- two runs at once ----------------------------------------------------------------------------------
def test_a_second_run_is_refused_the_run_name_of_a_run_still_going(tmp_path):
    results = tmp_path / "results"
    base = ["run", "default", "--set", "dataset=synthetic", "--set", "num-clients=4", "--set", "num-rounds=1",
            "--set", "run-name=same", "--results-dir", str(results), "--quiet"]
    # A: a round 1 of over a minute. B starts once A has made its (still empty) metrics.jsonl, i.e. in round 1
    first = start([*base, "--set", "local-epochs=5000", "--set", "seed=1"], tmp_path, "first")
    procs = [first]
    try:
        wait_for(lambda: (results / "same" / "metrics.jsonl").exists(), 40, "the first run to start round 1")
        second = start([*base, "--set", "local-epochs=1", "--set", "seed=2"], tmp_path, "second")
        procs.append(second)
        code = second.wait(timeout=40)
        assert first.poll() is None and not has_rows(results / "same" / "metrics.jsonl", 2)
        # measured: B exits 0 and writes its row and summary.json into results/same while A is still training
        # there; when A ends it appends its own round-1 row: metrics.jsonl [1, 1], from two runs, summary.json
        # from whichever ended last, and both commands report success
        assert code == 2, f"the second run wrote results/same (exit {code}) while the first was still running"
    finally:
        for p in procs:
            kill_all(p.pid)


# --- privfed run --engine simulation -------------------------------------------------------------------
FAKE_FLWR = textwrap.dedent("""
    import subprocess, sys
    # as `flwr run` does: a detached local SuperLink that outlives the command, with the same FLWR_HOME
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    print("fake flwr: superlink started", flush=True)
    import time; time.sleep(120)
""")

WITH_FAKE_FLWR = textwrap.dedent("""
    import subprocess, sys
    real = subprocess.Popen
    class Popen(real):
        def __init__(self, cmd, *args, **kwargs):
            if isinstance(cmd, list) and cmd[:2] == ["flwr", "run"]:
                cmd = [sys.executable, "-c", FAKE]
            super().__init__(cmd, *args, **kwargs)
    subprocess.Popen = Popen
    from cli.main import entry
    sys.argv = ["privfed", *sys.argv[1:]]
    sys.exit(entry())
""")


def test_sigterm_to_simulation_run_stops_the_flower_processes_it_started(tmp_path):
    """`flwr run` is replaced by a stand-in that starts a detached 'SuperLink' with the run's FLWR_HOME, as
    the real one does (measured with the real one: after SIGTERM to privfed, flower-superlink,
    flower-superexec, flwr-simulation, Ray's gcs_server/raylet/dashboard and the ClientApp actor all stayed up,
    the simulation kept training and appending to metrics.jsonl, and /tmp/privfed-flwr-* stayed on disk)."""
    script = WITH_FAKE_FLWR.replace("FAKE]", f"{FAKE_FLWR!r}]")
    log = open(tmp_path / "out.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", script, "run", "default", "--engine", "simulation",
                             "--set", "dataset=synthetic", "--set", "num-clients=2", "--set", "run-name=s",
                             "--results-dir", str(tmp_path / "results")],
                            cwd=REPO, env=child_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    home_prefix = str(tmp_path / "privfed-flwr-")
    try:
        wait_for(lambda: len(with_env_prefix(home_prefix)) >= 2, 40, "the stand-in flwr and its SuperLink")
        proc.send_signal(signal.SIGTERM)
        code, _ = survivors_after_exit(proc)
        assert code is not None
        left = with_env_prefix(home_prefix)
        assert left == [], f"SIGTERM left {len(left)} process(es) with the run's FLWR_HOME: {left}"
        assert not list(tmp_path.glob("privfed-flwr-*")), "the run's temporary FLWR_HOME was left on disk"
    finally:
        kill_all(proc.pid, with_env_prefix(home_prefix))


def test_simulation_timeout_is_reported_as_a_timeout(tmp_path, monkeypatch):
    import server.flower_run as flower_run
    from cli.run import SimulationFailed, run_one

    real = subprocess.Popen

    def fake_popen(cmd, *args, **kwargs):  # a `flwr run` that hangs
        return real([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                    *args, **kwargs)

    monkeypatch.setattr(flower_run.subprocess, "Popen", fake_popen)
    started = time.monotonic()
    with pytest.raises(SimulationFailed) as info:
        run_one({"dataset": "synthetic", "num-clients": 2, "num-rounds": 1, "run-name": "t",
                 "results-dir": str(tmp_path)}, engine="simulation", timeout=2)
    assert time.monotonic() - started < 20
    first = str(info.value).splitlines()[0]
    # measured: "flwr run failed (exit code -15); last output: ..." -- nothing says the --timeout ran out
    assert "time" in first.lower(), first


# --- privfed repro --jobs N ----------------------------------------------------------------------------
def endless_suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "suite.toml").write_text(textwrap.dedent("""
        [suite]
        name = "hyg"
        description = "process hygiene"
        seeds = [1, 2]
        base = "default"
        metric = "final-accuracy"
        rows = ["A"]
        columns = ["B"]

        [suite.overrides]
        num-clients = 4
        num-rounds = 100000
        dataset = "synthetic"

        [[cell]]
        row = "A"
        column = "B"
        overrides = { lr = 0.1 }
    """))
    return suite


def test_sigterm_to_repro_with_jobs_leaves_no_run_going(tmp_path):
    out = tmp_path / "repro"
    proc = start(["repro", str(endless_suite(tmp_path)), "--jobs", "2", "--out", str(out), "--no-plots"], tmp_path)
    metrics = out / "hyg" / "A__B" / "s1" / "metrics.jsonl"
    try:
        wait_for(lambda: has_rows(metrics), 40, "the first round")
        proc.send_signal(signal.SIGTERM)
        code, left = survivors_after_exit(proc)
        assert code is not None
        rows = len(metrics.read_text().splitlines())
        time.sleep(2)
        # measured: both workers kept running (state R) with ppid 1, appending ~15 rows/s to s1 and s2 --
        # a resumed `privfed repro` then writes the same metrics.jsonl as the orphan
        assert len(metrics.read_text().splitlines()) == rows, "an orphaned worker is still writing the run"
        assert left == [], f"SIGTERM left {len(left)} process(es) of the suite behind: {left}"
    finally:
        kill_all(proc.pid)


def test_sigint_to_repro_with_jobs_stops_promptly(tmp_path):
    out = tmp_path / "repro"
    proc = start(["repro", str(endless_suite(tmp_path)), "--jobs", "2", "--out", str(out), "--no-plots"], tmp_path)
    try:
        wait_for(lambda: has_rows(out / "hyg" / "A__B" / "s1" / "metrics.jsonl"), 40, "the first round")
        proc.send_signal(signal.SIGINT)  # `kill -INT`, `timeout -s INT`, a job runner: only privfed gets it
        # measured: "privfed: interrupted" is printed at once, then the process waits for every running job
        # to finish (still running 60 s later with 1500-round runs; here the runs never end)
        code, left = survivors_after_exit(proc, timeout=10)
        assert code == 130, "privfed repro did not stop within 10 s of SIGINT"
        assert left == []
    finally:
        kill_all(proc.pid)

