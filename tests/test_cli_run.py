"""`privfed run` / `privfed data` / the command registry: clear one-line errors and a tiny in-process run."""

import json

import pytest

from cli.main import build_parser, main
from cli.run import available_presets, build_overrides, parse_scalar, parse_seeds
from common.config import ConfigError


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_subcommands_registered():
    parser = build_parser()
    for argv in (["run", "default"], ["repro", "smoke"], ["report", "x"], ["data", "download", "adult"]):
        assert callable(parser.parse_args(argv).func)


def test_unknown_preset_lists_existing(capsys):
    code, out, err = run(capsys, "run", "no-such-preset")
    assert code == 2
    assert "unknown preset 'no-such-preset'" in err and "default" in err and "fedavg-syn-iid" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert set(available_presets()) >= {"default", "fedavg-mnist", "fedavg-syn-iid"}


def test_bad_set_key_names_close_match(capsys):
    code, out, err = run(capsys, "run", "default", "--set", "num-round=3")
    assert code == 2 and "unknown config key 'num-round'" in err and "num-rounds" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_set_value_and_form(capsys):
    code, _, err = run(capsys, "run", "default", "--set", "lr=fast")
    assert code == 2 and "'lr'" in err
    code, _, err = run(capsys, "run", "default", "--set", "lr")
    assert code == 2 and "key=value" in err
    code, _, err = run(capsys, "run", "default", "--seeds", "1,x")
    assert code == 2 and "--seeds" in err


def test_missing_data_file_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "run", "fedavg-mnist", "--set", f'data-dir="{tmp_path}"')
    assert code == 2 and "not found" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_parse_scalar():
    assert parse_scalar("0.05") == 0.05 and parse_scalar("3") == 3 and parse_scalar("true") is True
    assert parse_scalar('"x y"') == "x y" and parse_scalar("mnist") == "mnist"
    with pytest.raises(ConfigError):
        parse_scalar("[1, 2]")
    assert parse_seeds("1,2,3") == [1, 2, 3] and parse_seeds(None) is None


def test_run_tiny_inprocess_with_seeds(capsys, tmp_path):
    code, out, err = run(capsys, "run", "default", "--set", "num-rounds=2", "--set", 'run-name="tiny"',
                         "--set", "synthetic-iid=true", "--seeds", "1,2", "--results-dir", str(tmp_path), "--quiet")
    assert code == 0, err
    for seed in (1, 2):
        summary = json.loads((tmp_path / f"tiny-s{seed}" / "summary.json").read_text())
        assert summary["config"]["seed"] == seed and summary["config"]["synthetic-iid"] is True
        assert summary["rounds"] == 2
    assert "accuracy" in out and "mean ± std" in out
    assert f"results in {tmp_path / 'tiny-s1'}" in out


def test_run_from_path(capsys, tmp_path):
    preset = tmp_path / "mine.toml"
    preset.write_text('num-rounds = 1\nrun-name = "frompath"\n')
    code, out, err = run(capsys, "run", str(preset), "--results-dir", str(tmp_path / "res"))
    assert code == 0, err
    assert (tmp_path / "res" / "frompath" / "summary.json").is_file()
    assert "round    1/1" in out


def test_data_download_rejects_unknown_dataset(capsys):
    with pytest.raises(SystemExit):
        main(["data", "download", "syn-iid"])
    assert "invalid choice" in capsys.readouterr().err


def test_simulation_paths_are_made_absolute(monkeypatch, tmp_path):
    from cli.run import absolute_paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIVFED_DATA_DIR", "rel-data")
    out = absolute_paths({"results-dir": "res", "num-rounds": 1})
    assert out["data-dir"] == str(tmp_path / "rel-data") and out["results-dir"] == str(tmp_path / "res")
    assert out["num-rounds"] == 1


@pytest.mark.slow
def test_run_simulation_engine(capsys, tmp_path):
    code, out, err = run(capsys, "run", "default", "--engine", "simulation", "--set", "num-rounds=2",
                         "--set", "num-clients=3", "--set", 'run-name="sim"', "--results-dir", str(tmp_path))
    assert code == 0, err + out[-2000:]
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["clients"] == 3 and summary["rounds"] == 2


@pytest.mark.parametrize("preset, sets", [
    ("hu-adult", {"secure-aggregation": False}),  # presets/hu-adult.toml: the baseline without it
    ("upcycled-syn", {"upcycled": False, "num-rounds": 80}),  # presets/upcycled-syn.toml: the vanilla baseline
    ("upcycled-objective", {"upcycled": False, "objective-alpha": 10.0}),
    ("ali-mnist", {"strategy": "fedavg", "num-clients": 1, "partition": "iid", "local-steps": 2,
                   "target-epsilon": 0}),  # presets/repro/ali-table2/README.md: the central probe
])
def test_a_documented_preset_variant_drops_the_preset_keys_it_makes_unread(preset, sets):
    """The preset's secagg-min-survivors / upcycled-theta / dirichlet-alpha is not read once the --set
    values apply: refusing it (as a --set of it is refused) stopped the documented commands."""
    overrides, dropped = build_overrides(preset, sets)
    assert all(overrides[k] == v for k, v in sets.items()) and dropped and not set(dropped) & set(overrides)


def test_a_set_key_the_run_would_not_read_is_refused():
    with pytest.raises(ConfigError, match=r"upcycled-theta = 0.5 is read only with upcycled = true"):
        build_overrides("upcycled-syn", {"upcycled": False, "upcycled-theta": 0.5})
    with pytest.raises(ConfigError, match=r"prox-mu = 0.1 is read only with strategy = 'fedprox'"):
        build_overrides("default", {"prox-mu": 0.1})


def test_the_summary_records_the_data_dir_the_run_read(capsys, tmp_path, monkeypatch):
    """With data-dir unset, the in-process summary recorded "" (the simulation one the resolved path): which
    of $PRIVFED_DATA_DIR or ./data the run read was lost."""
    monkeypatch.setenv("PRIVFED_DATA_DIR", str(tmp_path / "my-data"))
    code, _, err = run(capsys, "run", "default", "--set", "num-rounds=1", "--set", 'run-name="d"',
                       "--results-dir", str(tmp_path), "--quiet")
    assert code == 0, err
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["config"]["data-dir"] == str(tmp_path / "my-data")


def test_run_says_which_preset_keys_it_dropped(capsys, tmp_path):
    code, out, err = run(capsys, "run", "upcycled-syn", "--set", "upcycled=false", "--set", "num-rounds=1",
                         "--results-dir", str(tmp_path), "--quiet")
    assert code == 0, err
    assert "dropped the preset's upcycled-theta, which this run does not read" in out
