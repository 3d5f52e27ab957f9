"""`privfed run --engine simulation` at its boundary with `flwr run`: paths, refusals, the results folder (an
adversarial review, session 20: each test failed on the code it reviewed)."""

from pathlib import Path

import pytest

from cli.run import absolute_paths

PRIVATE = {"num-clients": 2, "num-rounds": 1, "privacy": "dpsgd", "dp-sample-rate": 0.1, "local-steps": 2}


@pytest.mark.parametrize("key", ["state-dir", "checkpoint-dir"])
def test_simulation_makes_every_path_key_absolute(key, tmp_path, monkeypatch):
    """`--engine simulation` runs the ClientApps/ServerApp with the app folder as cwd, so a relative
    state-dir (the nodes' privacy ledgers) or checkpoint-dir lands under /work/main instead of the user's
    working directory (observed: `--set state-dir=rvstate_sim` from /tmp/rv_sim/cwd wrote the ledgers to
    /work/main/rvstate_sim; the in-process engine writes ./rvstate_sim). absolute_paths must resolve them
    in the user's process, as it does data-dir and results-dir."""
    monkeypatch.chdir(tmp_path)
    overrides = {**PRIVATE, key: "rel-folder"}
    if key == "checkpoint-dir":
        overrides = {**overrides, "checkpoint": True, "run-name": "x"}
    out = absolute_paths(overrides)
    assert Path(out[key]).is_absolute(), out[key]
    assert Path(out[key]) == tmp_path / "rel-folder"


OBSERVED_TAIL = (  # the tail of `flwr run` when the ServerApp refused the run (Flower itself exits 0)
    "common.config.ConfigError: results folder {d} already holds a run; choose another run-name or remove "
    "that folder\n\x1b[91mERROR \x1b[0m:     Exit Code: 700\n\nAn unhandled exception occurred when running "
    "the simulation.\n")


def test_simulation_refusal_matches_inprocess_exit_code_and_message(tmp_path, monkeypatch, capsys):
    """`privfed run default --set run-name=simA --set checkpoint=true` over a finished run (no checkpoint):
    the in-process engine prints `privfed run: error: results folder ... already holds a run` and exits 2;
    the simulation engine starts Flower and Ray (~40 s), then prints `flwr run failed (exit code 0); last
    output:` + a traceback tail and exits 1 (observed). The same refusal must be the same one-line error and
    exit code 2 on both engines, and never claim a failure 'with exit code 0'."""
    import server.flower_run
    from cli.main import main

    results = tmp_path / "r"
    (results / "x").mkdir(parents=True)
    (results / "x" / "summary.json").write_text("{}")
    (results / "x" / "metrics.jsonl").write_text('{"round": 1}\n')
    calls = []

    def fake_flower(overrides, num_supernodes, **kwargs):
        calls.append(overrides)
        return 0, OBSERVED_TAIL.format(d=results / "x"), None

    monkeypatch.setattr(server.flower_run, "run_with_flower", fake_flower)
    code = main(["run", "default", "--engine", "simulation", "--quiet", "--set", "num-rounds=1", "--set",
                 "run-name=x", "--set", "checkpoint=true", "--results-dir", str(results)])
    err = capsys.readouterr().err
    assert "exit code 0" not in err, err
    assert code == 2, (code, err)
    assert "already holds a run" in err.splitlines()[0], err


def test_simulation_results_folder_keeps_run_name_whitespace(tmp_path, monkeypatch):
    """run-name "tr " (trailing space; validate accepts it) on `--engine simulation`: the run finishes and
    writes '/tmp/rv_sim/r/tr /summary.json', but run_with_flower strips the printed path
    (server/flower_run.py:134) and `privfed run` then dies with a FileNotFoundError traceback for
    '/tmp/rv_sim/r/tr/summary.json' and exit 1 (observed); in-process the same run exits 0."""
    import server.flower_run as fr

    run_dir = tmp_path / "tr "
    run_dir.mkdir()

    class FakePopen:
        pid = 2 ** 22 + 12345  # no such process

        def __init__(self, *args, **kwargs):
            self.stdout = iter([f"privfed: results in {run_dir}\n"])

        def wait(self):
            return 0

    monkeypatch.setattr(fr.subprocess, "Popen", FakePopen)
    code, _, results = fr.run_with_flower({"run-name": "tr ", "results-dir": str(tmp_path)}, 2, timeout=30)
    assert code == 0
    assert results == run_dir, results


def test_a_data_file_error_in_the_serverapp_is_the_same_refusal_as_in_process(tmp_path, monkeypatch):
    """(review, session 21) A data file that fails inside the ServerApp (damaged after the CLI's preflight)
    exited 1 with a traceback tail on --engine simulation, 2 with one line in-process."""
    import server.flower_run
    from cli.run import run_one
    from common.data.errors import DataFileError

    tail = "common.data.errors.DataFileCorrupt: syn-iid: data file ... is damaged (x_train has NaN values)\n"
    monkeypatch.setattr(server.flower_run, "run_with_flower", lambda *a, **k: (0, tail, None))
    with pytest.raises(DataFileError, match="x_train has NaN values"):
        run_one({"num-rounds": 1, "results-dir": str(tmp_path)}, engine="simulation", quiet=True)
