"""User-facing commands: one-line errors, nothing lost, every printed epsilon says what it means."""

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cli.main import main
from common.config import ConfigError, validate
from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger

ROOT = Path(__file__).resolve().parents[1]

TINY = ["--set", "num-rounds=1", "--quiet"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err):
    return "Traceback" not in err and len(err.strip().splitlines()) == 1


# --- config ------------------------------------------------------------------------
def test_preset_that_is_not_toml_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("num-rounds = [\n")
    code, _, err = run(capsys, "run", str(bad))
    assert code == 2 and str(bad) in err and "TOML" in err and one_line_error(err)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused(value):
    with pytest.raises(ConfigError, match="'lr' must be a finite"):
        validate({"lr": value})
    with pytest.raises(ConfigError, match="'round-timeout'"):
        validate({"round-timeout": value})


def test_set_nan_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "run", "default", "--set", "lr=nan", "--results-dir", str(tmp_path))
    assert code == 2 and "'lr'" in err and one_line_error(err)
    assert not any(tmp_path.iterdir())  # nothing ran


def test_suite_overrides_must_be_a_table(tmp_path):
    from server.report import load_suite

    (tmp_path / "suite.toml").write_text('[suite]\nseeds = [1]\noverrides = "x"\n[[cell]]\nrow = "a"\ncolumn = "b"\n')
    with pytest.raises(ConfigError, match="overrides"):
        load_suite(str(tmp_path))
    (tmp_path / "suite.toml").write_text('[suite]\nseeds = [1]\n[[cell]]\nrow = "a"\ncolumn = "b"\noverrides = 3\n')
    with pytest.raises(ConfigError, match="overrides"):
        load_suite(str(tmp_path))


# --- results are never overwritten by mistake ------------------------------------
def test_rerun_with_same_run_name_is_refused(capsys, tmp_path):
    args = ["run", "default", "--set", 'run-name="keep"', "--results-dir", str(tmp_path), "--set", "num-rounds=2",
            "--quiet"]
    assert run(capsys, *args)[0] == 0
    metrics = (tmp_path / "keep" / "metrics.jsonl").read_text()
    code, _, err = run(capsys, *args[:-3], "--set", "num-rounds=1")
    assert code == 2 and "keep" in err and "already" in err and one_line_error(err)
    assert (tmp_path / "keep" / "metrics.jsonl").read_text() == metrics
    code, _, err = run(capsys, "run", "default", "--set", 'run-name="keep"', "--seeds", "1",
                       "--results-dir", str(tmp_path), *TINY)
    assert code == 0, err  # keep-s1 is another folder


def test_the_server_app_refuses_a_run_name_that_holds_a_run(tmp_path):
    """The `flwr run` path (the ServerApp) refuses too, before any client is asked."""
    from server.inprocess import run_inprocess

    config = validate({"run-name": "keep", "results-dir": str(tmp_path), "num-rounds": 1})
    run_inprocess(config)
    metrics = (tmp_path / "keep" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        run_inprocess(config)
    assert (tmp_path / "keep" / "metrics.jsonl").read_text() == metrics
    with pytest.raises(ConfigError, match="already holds a run"):  # no checkpoint to resume: a fresh start
        run_inprocess({**config, "checkpoint": True})
    assert (tmp_path / "keep" / "metrics.jsonl").read_text() == metrics


def test_default_run_names_never_collide(capsys, tmp_path, monkeypatch):
    import server.results

    monkeypatch.setattr(server.results, "default_run_name", lambda config: "same-second")
    for _ in range(2):
        assert run(capsys, "run", "default", "--results-dir", str(tmp_path), *TINY)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same-second", "same-second-2"]
    assert all((p / "summary.json").is_file() for p in tmp_path.iterdir())


# --- every epsilon printed says delta, relation and sampling -----------------------
def test_privacy_calculator_states_relation_and_sampling(capsys):
    base = ["privacy", "epsilon", "--q", "0.015", "--sigma", "1.1", "--steps", "158", "--delta", "1e-5"]
    code, out, _ = run(capsys, *base)
    assert code == 0 and "delta = 1e-05" in out and "add/remove" in out and "Poisson" in out
    obj = json.loads(run(capsys, *base, "--json")[1])
    assert obj["delta"] == 1e-5 and obj["relation"] == "add-remove" and obj["sampling"] == "poisson"
    for argv in (["sigma", "--epsilon", "2", "--steps", "300"], ["steps", "--epsilon", "2", "--sigma", "1.1"]):
        code, out, _ = run(capsys, "privacy", *argv, "--delta", "1e-5", "--q", "0.015")
        assert code == 0 and "add/remove" in out and "Poisson" in out


def test_privacy_epsilon_refuses_negative_steps(capsys):
    code, out, err = run(capsys, "privacy", "epsilon", "--q", "0.01", "--sigma", "1", "--steps", "-3",
                         "--delta", "1e-5")
    assert code == 2 and out == "" and "--steps" in err and one_line_error(err)


@pytest.fixture()
def ledger_file(tmp_path):
    path = tmp_path / "ledger.json"
    PrivacyLedger([dpsgd_steps(0.0256, 1.0, 200, round=1)]).save(path)
    return str(path)


def test_ledger_text_uses_the_conversion_asked_for(capsys, ledger_file):
    args = ["privacy", "ledger", ledger_file, "--delta", "1e-5", "--conversion", "classic"]
    classic = json.loads(run(capsys, *args, "--json")[1])["epsilon"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and f"epsilon [rdp/classic] = {classic:.4f}" in out


def test_ledger_unknown_accountant_is_refused(capsys, ledger_file):
    with pytest.raises(SystemExit):
        main(["privacy", "ledger", ledger_file, "--delta", "1e-5", "--accountant", "bogus"])
    assert "invalid choice" in capsys.readouterr().err


def test_ledger_states_relations_and_sampling(capsys, ledger_file):
    obj = json.loads(run(capsys, "privacy", "ledger", ledger_file, "--delta", "1e-5", "--json")[1])
    assert obj["relations"] == ["add-remove"] and obj["sampling"] == ["poisson"] and obj["delta"] == 1e-5
    out = run(capsys, "privacy", "ledger", ledger_file, "--delta", "1e-5")[1]
    assert "add-remove" in out and "sampling: Poisson" in out


def test_ledger_that_is_not_json_names_the_file(capsys, tmp_path):
    path = tmp_path / "x.json"
    path.write_text("not json")
    code, _, err = run(capsys, "privacy", "ledger", str(path), "--delta", "1e-5")
    assert code == 2 and str(path) in err and one_line_error(err)


def test_run_table_epsilon_states_delta_relation_and_sampling(capsys, tmp_path):
    code, out, err = run(capsys, "run", "default", "--set", "privacy=dpsgd", "--set", "local-steps=1",
                         "--results-dir", str(tmp_path), *TINY)
    assert code == 0, err
    note = next(line for line in out.splitlines() if line.startswith("epsilon:"))
    assert "delta = 1e-05" in note and "add-remove" in note and "Poisson" in note and "q = 0.01" in note
    code, out, err = run(capsys, "report", str(tmp_path), "--no-plots")
    assert code == 0 and any(line.startswith("epsilon:") and "add-remove" in line for line in out.splitlines())


def test_report_skips_a_damaged_run(capsys, tmp_path):
    assert run(capsys, "run", "default", "--set", 'run-name="good"', "--results-dir", str(tmp_path), *TINY)[0] == 0
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text('{"config": {')
    code, out, err = run(capsys, "report", str(tmp_path), "--no-plots")
    assert code == 0 and "good" in out
    assert "bad" in err and "skipped" in err and "Traceback" not in err


def test_help_is_for_users(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "registered here" not in out and "differential" in out.lower()


def test_report_errors_go_to_stderr(capsys, tmp_path):
    code, out, err = run(capsys, "report", str(tmp_path / "missing"))
    assert code == 2 and out == "" and "not a folder" in err and one_line_error(err)
    code, out, err = run(capsys, "report", str(tmp_path))
    assert code == 2 and out == "" and "no finished runs" in err and one_line_error(err)


def test_suite_report_states_what_its_epsilon_is(capsys, tmp_path):
    folder = tmp_path / "eps"
    folder.mkdir()
    (folder / "suite.toml").write_text(
        '[suite]\nseeds = [1]\nmetric = "accuracy-at-epsilon"\nmetric-param = 0.5\n'
        '[suite.overrides]\nnum-rounds = 2\nprivacy = "dpsgd"\nlocal-steps = 1\n'
        '[[cell]]\nrow = "DP-FedAvg"\ncolumn = "Synthetic"\n')
    code, out, err = run(capsys, "repro", str(folder), "--out", str(tmp_path / "out"), "--no-plots")
    assert code == 0, err
    md = (tmp_path / "out" / "eps" / "report.md").read_text()
    line = next(line for line in md.splitlines() if line.startswith("- epsilon:"))
    assert "delta = 1e-05" in line and "add-remove" in line and "Poisson" in line


@pytest.mark.parametrize("engine,flag,value", [("inprocess", "--threads", "-1"), ("simulation", "--timeout", "0"),
                                               ("simulation", "--timeout", "nan")])
def test_bad_run_flags_are_one_line(capsys, tmp_path, engine, flag, value):
    code, _, err = run(capsys, "run", "default", "--engine", engine, flag, value, "--results-dir", str(tmp_path),
                       *TINY)
    assert code == 2 and flag in err and one_line_error(err)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("engine,flag,value", [("inprocess", "--timeout", "60"), ("simulation", "--workers", "2"),
                                               ("simulation", "--threads", "2")])
def test_an_option_of_the_other_engine_is_refused_not_ignored(capsys, tmp_path, engine, flag, value):
    code, _, err = run(capsys, "run", "default", "--engine", engine, flag, value, "--results-dir", str(tmp_path),
                       *TINY)
    assert code == 2 and f"{flag} applies to --engine" in err and one_line_error(err)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("extra", [["--conversion", "classic"], ["--orders", "integer"]])
def test_rdp_options_with_the_pld_accountant_are_refused_not_ignored(capsys, extra):
    code, out, err = run(capsys, "privacy", "epsilon", "--q", "0.01", "--sigma", "1.1", "--steps", "10",
                         "--delta", "1e-5", "--accountant", "pld", *extra)
    assert code == 2 and f"{extra[0]} applies to --accountant rdp only" in err and not out
    code, out, _ = run(capsys, "privacy", "epsilon", "--q", "0.01", "--sigma", "1.1", "--steps", "10",
                       "--delta", "1e-5", *extra, "--json")
    assert code == 0 and json.loads(out)[extra[0].removeprefix("--")] == extra[1]


def test_config_errors_name_only_real_keys():
    from common.config import SCHEMA

    with pytest.raises(ConfigError) as info:
        validate({"strategy": "dpfedavg-hu", "hu-clip": 0.0, "target-epsilon": 1.0})
    named = {word.strip("'\",.()") for word in str(info.value).split() if word.startswith(("hu-", "target-"))}
    assert named and named <= set(SCHEMA), named


@pytest.mark.parametrize("argv", [
    ["sigma", "--epsilon", "nan", "--delta", "1e-5", "--q", "0.01", "--steps", "100"],
    ["steps", "--epsilon", "nan", "--delta", "1e-5", "--q", "0.01", "--sigma", "1"],
    ["sigma", "--epsilon", "inf", "--delta", "1e-5", "--q", "0.01", "--steps", "100"],
    ["epsilon", "--q", "0.01", "--sigma", "inf", "--steps", "10", "--delta", "1e-5"],
])
def test_privacy_calculator_refuses_non_finite_numbers(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(["privacy", *argv])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and "finite" in err


def test_a_refused_resume_is_the_users_to_fix_and_says_all_of_it(capsys, tmp_path):
    """A resume refused for a changed config (CheckpointError) exited 1 with its first line and a pointer
    to PRIVFED_DEBUG, like a crash; it is a refusal of the user's input, as a ConfigError is: exit 2."""
    common = ["run", "default", "--set", "checkpoint=true", "--set", 'run-name="c"', "--set",
              f'state-dir="{tmp_path / "state"}"', "--results-dir", str(tmp_path / "res"), "--quiet"]
    code, _, err = run(capsys, *common, "--set", "num-rounds=2")
    assert code == 0, err
    code, _, err = run(capsys, *common, "--set", "num-rounds=2", "--set", "lr=0.5")
    assert code == 2 and "different run config" in err and "PRIVFED_DEBUG" not in err, err

# --- an adversarial review, session 21: each test failed on the code it reviewed ---------------------------
def _run_dir(tmp_path, final, metrics_lines=None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({
        "final": final, "rounds": 1, "wall_seconds": 1.0,
        "config": {"seed": 0, "strategy": "fedavg", "dataset": "synthetic"}}))
    if metrics_lines is not None:
        (run / "metrics.jsonl").write_text("".join(line + "\n" for line in metrics_lines))
    return run


def test_report_damaged_summary_value_no_traceback(tmp_path, capsys):
    # summary.json's final accuracy is a string: `privfed report` dies with a ValueError traceback.
    run = _run_dir(tmp_path, {"accuracy": "abc", "loss": 1.0})
    rc = main(["report", str(run), "--no-plots"])  # must not raise
    assert rc in (1, 2)
    assert "skipped" in capsys.readouterr().err


def test_report_damaged_metrics_line_no_traceback(tmp_path, capsys):
    # A torn line in the middle of metrics.jsonl (last line fine): the table is read, then _plot's
    # read_rows raises JSONDecodeError, which only `except OSError` guards: a traceback.
    good = json.dumps({"round": 2, "accuracy": 0.5, "loss": 1.0})
    run = _run_dir(tmp_path, {"accuracy": 0.5, "loss": 1.0}, ['{"round": 1, "accur', good])
    rc = main(["report", str(run)])  # must not raise
    assert rc in (0, 1, 2)


def test_data_download_network_failure_is_one_line_error(tmp_path, monkeypatch, capsys):
    # torchvision's MNIST.download raises RuntimeError("Error downloading <file>") when no mirror can be
    # reached (and RuntimeError on a failed MD5); `_download` catches only ImportError/ValueError/OSError.
    class _Offline:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    datasets = types.ModuleType("torchvision.datasets")
    datasets.MNIST = datasets.FashionMNIST = datasets.CIFAR10 = _Offline
    tv = types.ModuleType("torchvision")
    tv.datasets = datasets
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets)
    rc = main(["data", "download", "mnist", "--data-dir", str(tmp_path / "d")])  # must not raise
    assert rc == 2
    assert not list((tmp_path / "d").rglob("*.gz"))


def test_data_check_detects_corrupt_cifar10(tmp_path, capsys):
    # A CIFAR-10 folder of garbage files: `data check` does not look at it at all and exits 0
    # (README documents that CIFAR-10's batches have no digest; torchvision lists one MD5 per batch file).
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(b"\0" * 100)
    rc = main(["data", "check", "--data-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc != 0 or "cifar" in out, out


def _help(*argv: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "cli.main", *argv, "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_data_check_help_names_the_md5_digests_cifar10_is_checked_by():
    """(review, session 21) `privfed data --help` said `check` compares every file with its publisher's SHA-256, and the
    `check` sub-command's one-line help says "SHA-256 digests"; CIFAR-10's batch files are
    compared by MD5 (provenance.PUBLISHED_MD5), as README.md now says ("its publisher's digest")."""
    from common.data.provenance import PUBLISHED_MD5

    assert PUBLISHED_MD5  # CIFAR-10 is checked by MD5
    text = _help("data")
    assert "SHA-256" not in text or "MD5" in text, text
