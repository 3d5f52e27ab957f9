"""The user docs tell the truth (from an adversarial review of README.md, docs/ and the CLI's help): each
test runs what a document promises, with small settings, and checks the documented behaviour."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from cli.main import main
from cli.run import read_summary
from common.config import defaults, validate
from common.privacy.ledger import PrivacyLedger
from server.inprocess import run_inprocess
from tests.conftest import data_dir_or_skip

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


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
    # README (The privfed command) names the table's columns; it named a results-folder column that was not one
    header = next(line for line in out.splitlines() if "accuracy" in line and "seconds" in line)
    printed = [c.strip() for c in re.split(r"[┃│|]", header) if c.strip()]
    sentence = re.search(r"It prints the rounds and a final table \((.*?)\), then each run's results folder",
                         " ".join(README.read_text().split()))
    assert sentence and re.findall(r"(?:^|; |, )(\w+)", sentence.group(1))[:len(printed)] == printed, printed


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


# --- review of session 18 ---

def test_report_redraws_a_private_runs_accuracy_vs_epsilon_plot(capsys, tmp_path, one_torch_thread):
    """README (Results): a private run writes `accuracy_vs_epsilon.png`, and "`privfed report DIR...`
    re-renders suite reports and run plots from finished runs". Re-rendering a private run's plots must
    redraw both of its plots, not only `accuracy.png`."""
    code, _, err = _run(capsys, "run", "default", "--set", "num-rounds=2", "--set", "privacy=dpsgd",
                        "--set", "local-steps=2", "--set", "run-name=priv", "--results-dir", str(tmp_path),
                        "--quiet")
    assert code == 0, err
    run_dir = tmp_path / "priv"
    assert (run_dir / "accuracy_vs_epsilon.png").is_file()  # the run itself draws it
    for png in run_dir.glob("*.png"):
        png.unlink()
    code, _, err = _run(capsys, "report", str(run_dir))
    assert code == 0, err
    assert (run_dir / "accuracy.png").is_file()
    assert (run_dir / "accuracy_vs_epsilon.png").is_file(), (
        "privfed report redrew accuracy.png but not the private run's accuracy_vs_epsilon.png")


def test_repro_list_narrows_to_the_filtered_cells_or_refuses_the_filter(capsys):
    """README (privfed command): `--filter TEXT` and `--seeds N` narrow a suite "for quick checks", and
    `--list` lists a suite's cells. `privfed repro smoke --list --filter lr=0.03 --seeds 1` (a user previewing
    what a filtered run would do) printed every cell with both seeds: the filter and the seed count were
    silently ignored. Either list only what would run, or refuse the combination (exit 2)."""
    code, out, err = _run(capsys, "repro", "smoke", "--list", "--filter", "lr=0.03", "--seeds", "1")
    if code == 2:
        return  # refused: acceptable, the user is told
    assert code == 0, err
    cells = [line for line in out.splitlines() if line.startswith("  ")]
    assert cells and all("lr=0.03" in line for line in cells), f"--filter ignored by --list:\n{out}"
    assert all(line.rstrip().endswith("seeds 1") for line in cells), f"--seeds ignored by --list:\n{out}"


def test_simulation_engine_can_give_clients_the_gpu_the_readme_promises(monkeypatch, tmp_path):
    """README (Engines): the Flower simulation engine, `privfed run PRESET --engine simulation`, offers
    "GPU resources per client (`client-resources-num-gpus`)". privfed's simulation command runs
    `flwr run ... --federation-config num-supernodes=N` with a private FLWR_HOME and never passes client GPU
    resources, so Flower's default (num-gpus = 0) applies, and Ray (2.55: RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO
    defaults on) sets CUDA_VISIBLE_DEVICES="" in every 0-GPU actor: with `device = "cuda"` (or "auto" on a
    GPU box) the ClientApps see no GPU. `client-resources-num-gpus` is no run-config key and no `privfed run`
    option either. The command built for a cuda run must request GPUs for its clients."""
    import server.flower_run as flower_run

    captured: list[list[str]] = []

    class Captured(Exception):
        pass

    def fake_popen(command, *args, **kwargs):
        captured.append(list(command))
        raise Captured

    monkeypatch.setattr(flower_run.subprocess, "Popen", fake_popen)
    with pytest.raises(Captured):
        flower_run.run_with_flower({"device": "cuda"}, 2, flwr_home=tmp_path / "home", timeout=5,
                                   gpus_per_client=0.25)
    with pytest.raises(Captured):
        flower_run.run_with_flower({}, 2, flwr_home=tmp_path / "home", timeout=5)
    gpu, default = (command[command.index("--federation-config") + 1] for command in captured)
    # Flower takes either the resources given or its defaults: the CPUs must come with the GPUs
    assert gpu == "num-supernodes=2 client-resources-num-cpus=2 client-resources-num-gpus=0.25"
    assert default == "num-supernodes=2"  # Flower's defaults, as before


def test_a_cuda_simulation_run_without_gpus_per_client_is_refused(capsys):
    code, _, err = _run(capsys, "run", "default", "--engine", "simulation", "--set", "device=cuda")
    assert code == 2 and "--gpus-per-client" in err
    code, _, err = _run(capsys, "run", "default", "--gpus-per-client", "1")
    assert code == 2 and "--engine simulation only" in err


def _table_row(text: str, needle: str) -> str:
    (row,) = [line for line in text.splitlines() if line.startswith("|") and needle in line]
    return row


def test_hu_adult_preset_is_not_described_as_a_dp_guarantee_its_runs_say_it_is_not(
        capsys, tmp_path, one_torch_thread):
    """README (presets table) says `hu-adult.toml` is "LR at (10, 1e-4)-DP", and the preset's own header says
    "at (10, 1e-4)-DP". Its run uses `hu-accountant = "paper"` with Hu et al.'s /r secure-aggregation credit:
    the run's final epsilon line says "NOT A GUARANTEE of this run" and summary.json lists the assumption
    per client. Under the conservative accountant the same noise gives rho 10x larger (K_cons / K_paper =
    E r m / (tau gamma) = 5 * 10 * 2442 / (10 * 1221) = 10): epsilon ~44, not 10. A statement of the
    preset's guarantee must carry the same qualification as the run's output."""
    data = data_dir_or_skip("adult", "adult.data")
    code, out, err = _run(capsys, "run", "hu-adult", "--set", "num-rounds=1", "--set", "run-name=hu",
                          "--set", f"data-dir={data}", "--results-dir", str(tmp_path), "--quiet")
    assert code == 0, err
    ledgers = json.loads((tmp_path / "hu" / "summary.json").read_text())["privacy"]["ledgers"]
    assert any(ledger["assumptions"] for ledger in ledgers.values())
    assert "NOT A GUARANTEE" in out + err

    qualified = re.compile(r"NOT A GUARANTEE|assum|heuristic|not a guarantee", re.IGNORECASE)
    row = _table_row(README.read_text(), "`hu-adult.toml`")
    assert not ("-DP" in row and not qualified.search(row)), f"README states an unqualified guarantee: {row}"
    header = "".join(line for line in (REPO / "presets" / "hu-adult.toml").read_text().splitlines(True)
                     if line.startswith("#"))
    assert not ("(10, 1e-4)-DP" in header and not qualified.search(header)), (
        "presets/hu-adult.toml's header states (10, 1e-4)-DP without the assumption its run prints")


def test_quiet_run_still_prints_the_run_seed_privacy_note(capsys, tmp_path, one_torch_thread):
    """README (Privacy): with `dp-noise-seed = "run-seed"` anyone who knows the run config can regenerate and
    subtract the noise, and "a private run in that mode prints a note". `--quiet` is documented as "no
    per-round lines, only the summary", yet it silences every run message, this privacy warning included:
    `privfed run ... --set dp-noise-seed=run-seed --quiet` prints only the results table."""
    code, out, err = _run(capsys, "run", "default", "--set", "num-rounds=1", "--set", "privacy=dpsgd",
                          "--set", "local-steps=1", "--set", "dp-noise-seed=run-seed", "--set", "run-name=rs",
                          "--results-dir", str(tmp_path), "--quiet")
    assert code == 0, err
    assert json.loads((tmp_path / "rs" / "summary.json").read_text())["privacy"]["noise_seed"] == "run-seed"
    assert "run-seed" in out + err, f"--quiet dropped the run-seed privacy note:\n{out}{err}"


def test_quiet_run_still_says_a_data_file_is_not_the_published_one(capsys, tmp_path, one_torch_thread):
    """README (Data): a data file that passes the format checks but differs from its publisher's "still runs,
    and its log says `data: <file> is not the published file`" -- the only thing that keeps results on
    other data from being mistaken for the published dataset's. Under `privfed run --quiet` ("no per-round
    lines, only the summary") the warning is not printed at all (measured: 1 line without --quiet, 0 with)."""
    source = data_dir_or_skip("adult", "adult.data") / "adult"
    folder = tmp_path / "data" / "adult"
    folder.mkdir(parents=True)
    for name in ("adult.data", "adult.test"):
        (folder / name).write_bytes((source / name).read_bytes())
    lines = (folder / "adult.data").read_text().split("\n")
    lines[0] = lines[0].replace("<=50K", ">50K") if "<=50K" in lines[0] else lines[0].replace(">50K", "<=50K")
    (folder / "adult.data").write_text("\n".join(lines))  # one flipped label: still a valid file
    code, out, err = _run(capsys, "run", "default", "--set", "dataset=adult", "--set", "num-rounds=1",
                          "--set", f"data-dir={tmp_path / 'data'}", "--set", "run-name=mod",
                          "--results-dir", str(tmp_path / "results"), "--quiet")
    assert code == 0, err
    files = json.loads((tmp_path / "results" / "mod" / "summary.json").read_text())["data_files"]
    assert any(f["file"] == "adult/adult.data" and f["published"] is False for f in files)
    assert "is not the published file" in out + err, f"--quiet dropped the data warning:\n{out}{err}"


def test_every_metrics_jsonl_field_is_documented(capsys, tmp_path, one_torch_thread):
    """README (Results) lists the fields of a `metrics.jsonl` row. With `eval-every > 1` the rows carry
    `evaluated` (false: `accuracy`/`loss` repeat the last evaluation, in round 1 the initial model's), which
    the README's list leaves out, so a user reading round 1's `accuracy` as the model after round 1 is wrong
    (measured: eval-every 2, round 1 row accuracy 0.1364 = the initial model's)."""
    code, _, err = _run(capsys, "run", "default", "--set", "num-rounds=3", "--set", "eval-every=2",
                        "--set", "run-name=ev", "--results-dir", str(tmp_path), "--quiet")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "ev" / "metrics.jsonl").read_text().splitlines() if line]
    keys = set().union(*rows)
    row = _table_row(README.read_text(), "`metrics.jsonl`")
    documented = set(re.findall(r"`([a-z_]+)`", row))
    assert keys <= documented, f"metrics.jsonl fields missing from README's list: {sorted(keys - documented)}"


def test_summary_config_records_the_resolved_default_run_name(tmp_path):
    # README, Results: summary.json holds "the resolved config" (a new-user review, session 20). When run-name is left empty (the
    # default, and what every plain `flwr run . --stream` does), the runner names the folder
    # <strategy>-<dataset>-<timestamp> (server/runner.py run_federation) but summary.json keeps
    # run-name = "", so the summary does not say which run it is (privfed run fills it in; flwr run does not).
    config = validate({**defaults(), "num-rounds": 1, "results-dir": str(tmp_path)})
    assert config["run-name"] == ""
    run_dir = run_inprocess(config, console=Console(file=io.StringIO()))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"]["run-name"] == run_dir.name
