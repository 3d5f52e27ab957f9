"""Following docs/extending.md as a new researcher, and the privfed CLI (an adversarial review,
session 12; the privacy-mechanism steps are tested in test_privacy_release.py).

Each extension is built the way the guide says (a strategy mixing in `RosterSampling`, a rule in
`RULES`, the name in `STRATEGIES`/`SCHEMA`, the build in `build_base`, a model in `build_model`, a
mechanism in `PRIVATE_RULES`, ...), without editing the repository: the registries are monkeypatched
for the duration of a test. The guide promises that "the Upcycled wrapper, stragglers, checkpoints and
secure aggregation then apply without more code"; the tests below hold it to that promise (or to a
clear refusal) and check the CLI's one-line errors.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch.nn as nn
from flwr.app import MetricRecord
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from rich.console import Console

import client.node
import client.updates as updates
import common.config as cc
import common.data as data
import common.models as models
import server.runner as runner
import server.strategies.registry as registry
from common.config import ConfigError, validate
from common.data.federation import ClientData, Federation
from common.records import METRICS
from server.inprocess import run_inprocess
from server.inprocess_grid import InProcessGrid
from server.strategies.fedavg import RosterSampling
from server.strategies.scaffold import Scaffold
from fault_grids import DiesAfter, Killed

REPO = Path(__file__).resolve().parents[1]
QUIET = Console(quiet=True)


# --- following the guide: registering a strategy, a rule, a model -------------------------------

def register_strategy(monkeypatch, name: str, build, rule=("client.updates.sgd", "sgd_update"),
                      secagg: bool = False) -> None:
    """docs/extending.md, "A federated algorithm", steps 2-4, for strategy `name`."""
    monkeypatch.setitem(updates.RULES, name, rule)  # 2. the client rule in RULES
    strategies = cc.STRATEGIES + (name,)  # 3. the name in STRATEGIES (and so in SCHEMA's choices)
    monkeypatch.setattr(cc, "STRATEGIES", strategies)
    monkeypatch.setitem(cc.SCHEMA, "strategy", dataclasses.replace(cc.SCHEMA["strategy"], choices=strategies))
    if secagg:  # "List it in SECAGG_STRATEGIES once tested"
        monkeypatch.setattr(cc, "SECAGG_STRATEGIES", cc.SECAGG_STRATEGIES + (name,))
    original = registry.build_base

    def build_base(config, roster, log=print):  # 4. build it in build_base
        if config["strategy"] == name:
            return build(roster, int(config["seed"]), float(config["fraction-train"]), log)
        return original(config, roster, log)

    monkeypatch.setattr(registry, "build_base", build_base)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def model_arrays(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "model.npz") as z:
        return {k: z[k] for k in z.files}


def run_on_grid(cfg, run_id: int, die_after: int | None = None) -> Path | None:
    client.node._local.clear()  # a fresh client process for every run
    with InProcessGrid("client.app:app", dict(cfg), int(cfg["num-clients"]), run_id=run_id) as grid:
        if die_after is None:
            return runner.run_federation(grid, cfg, QUIET)
        with pytest.raises(Killed):
            runner.run_federation(DiesAfter(grid, die_after), cfg, QUIET)
    return None


# --- 1. a strategy built on a Flower strategy, as the guide says ----------------------------------

def test_guide_strategy_mixing_roster_sampling_into_flowers_fedadam_runs(tmp_path, monkeypatch):
    """"Mix RosterSampling into the Flower strategy you build on, as FedProx does". For Flower's FedAdam
    (and FedAdagrad, FedYogi, FedAvgM with momentum, QFedAvg) RosterSampling.configure_train replaces
    Flower's, which is where those strategies record the model they step from (`current_arrays`):
    round 1 dies with Flower's AggregationError "Current arrays not set"."""

    class FedAdam(RosterSampling, FlowerFedAdam):
        def __init__(self, roster, seed, fraction_train, log=print):
            super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                             min_available_nodes=len(roster.node_of))
            self.setup_sampling(roster, seed, fraction_train, log)

        def aggregate_train(self, server_round, replies):
            return super().aggregate_train(server_round, self.screened(replies))

    register_strategy(monkeypatch, "fedadam", FedAdam)
    cfg = validate({"strategy": "fedadam", "num-rounds": 2, "results-dir": str(tmp_path), "run-name": "adam"})
    out = run_inprocess(cfg, console=QUIET)
    assert [r["round"] for r in rows(out)] == [1, 2]


# --- 2. secure aggregation: secagg_unit_records behind the Upcycled wrapper ------------------------

class ScaffoldV2(Scaffold):
    """A new SCAFFOLD-like method that declares its unit-weight record as the guide says
    (`secagg_unit_records`), instead of an entry in secagg_grid.UNIT_RECORDS keyed by a built-in name."""

    secagg_unit_records = ("control-delta",)


def build_scaffold_v2(roster, seed, fraction, log=print):
    return ScaffoldV2(roster, seed, fraction, log)


def test_secagg_unit_records_of_a_new_strategy_apply_under_upcycled(tmp_path, monkeypatch):
    """Guide: records summed with weight 1 "go in secagg_unit_records"; the Upcycled wrapper and secure
    aggregation "then apply without more code". With upcycled = true the runner hands the wrapper to
    `unit_records_for` (server/runner.py:137), whose getattr does not see the base's attribute
    (server/secagg_grid.py:159): control-delta is weighted by num-examples, and the secure run leaves
    the plaintext one (built-in SCAFFOLD, listed by name in UNIT_RECORDS: 4e-6 apart)."""
    register_strategy(monkeypatch, "scaffold-v2", build_scaffold_v2,
                      rule=("client.updates.scaffold", "scaffold_update"), secagg=True)
    base = {"strategy": "scaffold-v2", "num-clients": 3, "num-rounds": 3, "upcycled": True, "lr": 0.05,
            "results-dir": str(tmp_path)}
    plain = run_inprocess(validate({**base, "run-name": "plain"}), console=QUIET)
    secure = run_inprocess(validate({**base, "run-name": "secure", "secure-aggregation": True}), console=QUIET)
    a, b = model_arrays(plain), model_arrays(secure)
    gap = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    assert gap < 1e-4, f"secure aggregation changed the run: max |secure - plain| = {gap:.3g}"


# --- 3. checkpoints: plain-data state of a new strategy --------------------------------------------

class CountingFedAvg(RosterSampling, FlowerFedAvg):
    """FedAvg that counts how often each partition was aggregated: plain data (a defaultdict of ints),
    which the guide says checkpoints save and restore without more code."""

    def __init__(self, roster, seed, fraction_train, log=print):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of))
        self.setup_sampling(roster, seed, fraction_train, log)
        self.participation = collections.defaultdict(int)

    def aggregate_train(self, server_round, replies):
        good = self.screened(replies)
        for msg in good:
            self.participation[self._partition_of[msg.metadata.src_node_id]] += 1
        return super().aggregate_train(server_round, good)


def test_new_strategy_with_defaultdict_state_resumes_from_its_own_checkpoint(tmp_path, monkeypatch):
    """auto_state saves a defaultdict (it is plain data), the file restores it as a dict, and
    load_auto_state (server/checkpoint.py:113, `_kind`) then refuses the strategy's own checkpoint:
    "values of the wrong type for ['participation']". Same for OrderedDict, Counter and frozenset."""
    register_strategy(monkeypatch, "fedavg-count", CountingFedAvg)
    base = {"strategy": "fedavg-count", "num-clients": 2, "num-rounds": 3, "fraction-train": 0.5,
            "results-dir": str(tmp_path / "results")}
    whole = run_on_grid(validate({**base, "run-name": "whole"}), run_id=1)
    part = validate({**base, "run-name": "part", "checkpoint": True})
    run_on_grid(part, run_id=2, die_after=2)
    resumed = run_on_grid(part, run_id=3)
    assert [r["round"] for r in rows(resumed)] == [1, 2, 3]
    a, b = model_arrays(whole), model_arrays(resumed)
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6)


# --- 4. checkpoints: the node's Context.state of a new rule ----------------------------------------

def visits_update(client_, content, state):
    """A rule keeping per-node state in Context.state, as the guide describes it ("what persists across
    rounds"): how many times this node trained, in a MetricRecord; replied as a metric."""
    from client.updates.sgd import sgd_update

    reply = sgd_update(client_, content, state)
    visits = int(state["visits"]["n"]) + 1 if "visits" in state else 1
    state["visits"] = MetricRecord({"n": visits})
    reply[METRICS] = MetricRecord({**dict(reply[METRICS]), "visits": visits})
    return reply


def test_node_state_of_a_new_rule_survives_a_resume(tmp_path, monkeypatch):
    """client/resume.py snapshots only the ArrayRecords of Context.state: a rule whose state is a
    MetricRecord or ConfigRecord (a counter, a schedule position) silently restarted after a resume
    (round 3's nodes had trained 1 time, not 3). A resumable run now refuses such a rule."""
    register_strategy(monkeypatch, "fedavg-visits",
                      lambda roster, seed, fraction, log=print: __import__(
                          "server.strategies.fedavg", fromlist=["FedAvg"]).FedAvg(roster, seed, fraction, log),
                      rule=(__name__, "visits_update"))
    base = {"strategy": "fedavg-visits", "num-clients": 2, "num-rounds": 3, "results-dir": str(tmp_path / "r")}
    whole = run_on_grid(validate({**base, "run-name": "whole"}), run_id=1)
    assert [r["train_visits"] for r in rows(whole)] == [1, 2, 3]
    part = validate({**base, "run-name": "part", "checkpoint": True})
    with pytest.raises(RuntimeError, match="only ArrayRecords survive a resume"):
        run_on_grid(part, run_id=2)  # refused, not resumed with the counter silently reset


# --- 5. a model, as the guide says: build_model and the model key's choices -------------------------

def build_with_batchnorm(name, input_shape, num_classes, _original=models.build_model):
    if name == "mlp-bn":
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.BatchNorm1d(16), nn.ReLU(),
                             nn.Linear(16, num_classes))
    return _original(name, input_shape, num_classes)


def register_model(monkeypatch):
    for module in (models, runner, client.node):  # build_model, imported by name where models are built
        monkeypatch.setattr(module, "build_model", build_with_batchnorm)
    monkeypatch.setitem(cc.SCHEMA, "model", dataclasses.replace(cc.SCHEMA["model"], choices=cc.MODELS + ("mlp-bn",)))


def test_a_model_with_buffers_is_refused_before_any_round(tmp_path, monkeypatch):
    """A model with BatchNorm (running statistics, and an int64 num_batches_tracked that Flower's
    average turned into float64, after which every reply was dropped as wrong-typed; FedDyn drove
    running_var negative): refused with one clear error before any client trains."""
    register_model(monkeypatch)
    cfg = validate({"model": "mlp-bn", "num-rounds": 3, "results-dir": str(tmp_path), "run-name": "bn"})
    with pytest.raises(ConfigError, match="holds buffers .*GroupNorm"):
        run_inprocess(cfg, console=QUIET)
    assert not (tmp_path / "bn" / "metrics.jsonl").exists()


# --- 8. a dataset, as the guide says ------------------------------------------------------------------

def test_new_dataset_without_a_default_model_is_a_config_error(monkeypatch):
    """Guide, "A dataset or a model": a reader listed in SPLIT_DATASETS and load_splits. It does not
    mention the `dataset` key's choices (common/config.py DATASETS) nor DEFAULT_MODEL; with the first
    added and not the second, every validate() of that dataset raises a bare KeyError from
    resolve_model_name (common/config.py:69, called by _check_upcycled_private for every config), which
    the CLI does not catch (a traceback)."""
    import common.data as data

    monkeypatch.setattr(data, "SPLIT_DATASETS", data.SPLIT_DATASETS + ("kmnist",))
    dataset = cc.SCHEMA["dataset"]
    monkeypatch.setitem(cc.SCHEMA, "dataset", dataclasses.replace(dataset, choices=dataset.choices + ("kmnist",)))
    try:
        validate({"dataset": "kmnist"})
    except ConfigError:
        pass  # a one-line error naming what is missing is fine; a KeyError is not


# --- 9. the runner: what a run writes and prints --------------------------------------------------------

def test_a_run_whose_final_test_loss_is_not_finite_ends_normally(tmp_path, monkeypatch):
    """A diverged model can have finite weights (they pass the screening) and an infinite test loss
    (logits overflow). metrics.jsonl stores it as null, and the final line formats that None with
    `:.4f` (server/runner.py:218): TypeError after the results were written, so `privfed run` reports a
    failed run and `privfed repro` a failed cell."""
    real = runner.evaluate
    monkeypatch.setattr(runner, "evaluate", lambda *a, **k: (math.inf, real(*a, **k)[1]))
    cfg = validate({"num-rounds": 2, "results-dir": str(tmp_path), "run-name": "inf"})
    out = run_inprocess(cfg, console=QUIET)
    assert (out / "summary.json").is_file()


def test_default_run_names_taken_in_the_same_second_get_a_suffix(tmp_path, monkeypatch):
    """README, Results: "run-name defaults to <strategy>-<dataset>-<timestamp>, suffixed -2, -3, ... if
    taken". Only `privfed run` suffixes (cli/run.py claim_results); `run_inprocess` (the README's engine
    for sweeps) and the ServerApp refuse the second of two runs started in the same second."""
    import server.results

    monkeypatch.setattr(server.results.time, "strftime", lambda fmt, *a: "20250101-000000")
    cfg = validate({"num-rounds": 1, "results-dir": str(tmp_path)})
    first = run_inprocess(cfg, console=QUIET)
    second = run_inprocess(cfg, console=QUIET)
    assert first != second and (second / "summary.json").is_file()


# --- 10. the CLI: errors are one line, exit non-zero, keep what is written ------------------------------

def cli(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, **kw)


TINY_SUITE = """
[suite]
description = "tiny"
seeds = [1]

[suite.overrides]
num-rounds = 1

[[cell]]
row = "FedAvg"
column = "lr 0.1"
overrides = { lr = 0.1 }
paper = 50.0
"""


def test_repro_with_an_out_dir_that_cannot_be_created_is_a_one_line_error(tmp_path, capsys):
    """`privfed repro SUITE --out DIR` where DIR cannot be created (here: under a file; also a folder
    without write permission): write_snapshot's mkdir (cli/repro.py:151) runs outside the try that
    turns errors into one line, so the user gets a NotADirectoryError / PermissionError traceback.
    `privfed run --results-dir` gives "cannot create results folder ...: ..." for the same mistake."""
    from cli.main import main

    suite = tmp_path / "tiny"
    suite.mkdir()
    (suite / "suite.toml").write_text(TINY_SUITE)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code = main(["repro", str(suite), "--out", str(blocker / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("privfed repro: error:"), err


def test_report_on_a_damaged_suite_snapshot_is_a_one_line_error(tmp_path, capsys):
    """`privfed report DIR` where DIR/suite.json is damaged (or names a key a later privfed dropped):
    a JSONDecodeError / ConfigError traceback from render_report, while a damaged run's summary.json is
    "skipped" in one line (cli/report.py)."""
    from cli.main import main

    suite_dir = tmp_path / "tiny"
    suite_dir.mkdir()
    (suite_dir / "suite.json").write_text("{damaged")
    try:
        code = main(["report", str(suite_dir)])
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"privfed report raised {type(exc).__name__}: {exc}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("privfed report:"), err


def test_ctrl_c_during_privfed_run_is_one_line_and_keeps_the_rounds(tmp_path):
    """Ctrl-C (SIGINT) during `privfed run`: the rows already written stay (good), but the user gets a
    ~40-line KeyboardInterrupt traceback through Flower's record classes instead of one line saying
    the run was interrupted and where its partial results are."""
    run_dir = tmp_path / "r" / "x"
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "default", "--set", "num-rounds=100000",
                             "--set", "run-name=x", "--results-dir", str(tmp_path / "r")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # SIGINT at its default, as on a terminal (a background job inherits it ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 3  # nothing written is lost
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) <= 2, "\n".join(lines[-6:])


def test_repro_report_follows_the_suites_seeds_after_an_edit(tmp_path, capsys):
    """A suite run with seeds [1, 2], then edited to seeds = [1] (a seed dropped): the report still
    averages both seeds (report.csv n_seeds = 2) and says "seeds: 1; finished runs: 2 of 1 planned":
    `collect` (server/report.py) takes every seed folder whose config matches, whatever the suite's
    seeds. A quick `--seeds N` check must not shrink the report, but an edited suite should."""
    from cli.main import main

    suite = tmp_path / "tiny"
    suite.mkdir()
    (suite / "suite.toml").write_text(TINY_SUITE.replace("seeds = [1]", "seeds = [1, 2]"))
    out = tmp_path / "out"
    assert main(["repro", str(suite), "--out", str(out), "--no-plots"]) == 0
    (suite / "suite.toml").write_text(TINY_SUITE)  # seeds = [1]
    assert main(["repro", str(suite), "--out", str(out), "--no-plots"]) == 0
    capsys.readouterr()
    lines = (out / "tiny" / "report.csv").read_text().splitlines()
    n_seeds = lines[1].split(",")[5]
    assert n_seeds == "1", lines


def test_repro_report_counts_every_seed_a_seeds_n_check_ran(tmp_path, capsys):
    """`privfed repro SUITE --seeds N` runs the first N seeds of each cell, "extended with the next
    integers if there are fewer" (Suite.with_seed_count). Here the suite has seeds = [1] and --seeds 2
    runs s1 and s2 ("2 run(s) executed"), but the report it prints and writes right after says n = 1
    (report.csv n_seeds 1, the mean of s1 only): c9d72ee/08cc142 made `collect` (server/report.py)
    drop every seed not in the snapshot's cell.seeds, and cli/repro.py writes the snapshot from the
    unextended suite. Before, every finished seed folder with the cell's config was averaged."""
    from cli.main import main

    suite = tmp_path / "tiny"
    suite.mkdir()
    (suite / "suite.toml").write_text(TINY_SUITE)
    out = tmp_path / "out"
    assert main(["repro", str(suite), "--out", str(out), "--no-plots", "--seeds", "2"]) == 0
    capsys.readouterr()
    runs = sorted(p.name for p in (out / "tiny").glob("*/s*") if (p / "summary.json").is_file())
    assert runs == ["s1", "s2"], runs
    header, row = (out / "tiny" / "report.csv").read_text().splitlines()[:2]
    n_seeds = dict(zip(header.split(","), row.split(",")))["n_seeds"]
    assert n_seeds == "2", (header, row)


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def blobs_federation() -> Federation:
    rng = np.random.default_rng(0)
    clients = []
    for c in range(4):
        x = (rng.normal(size=(30, 5)) + c).astype(np.float32)
        y = (x.sum(1) > 5 * c).astype(np.int64)
        clients.append(ClientData(x, y, x[:0], y[:0]))
    xt = rng.normal(size=(20, 5)).astype(np.float32)
    return Federation(clients=clients, x_test=xt, y_test=(xt.sum(1) > 0).astype(np.int64), input_shape=(5,),
                      num_classes=2, description="blobs: 4 clients of their own", meta={"dataset": "blobs"})


def add_own_split_dataset(monkeypatch) -> None:
    """The guide's steps for a dataset with its own client split: its name in DATASETS (the `dataset` key's
    choices), its `model = "auto"` choice in DEFAULT_MODEL, and the federation built in `_build`."""
    dataset = cc.SCHEMA["dataset"]
    monkeypatch.setattr(cc, "DATASETS", cc.DATASETS + ("blobs",))
    monkeypatch.setitem(cc.SCHEMA, "dataset", dataclasses.replace(dataset, choices=dataset.choices + ("blobs",)))
    monkeypatch.setitem(cc.DEFAULT_MODEL, "blobs", "logreg")
    original = data._build

    def _build(key):
        return blobs_federation() if key[0] == "blobs" else original(key)

    monkeypatch.setattr(data, "_build", _build)
    client.node._local.clear()


def test_own_split_dataset_built_in__build_as_the_guide_says_runs(tmp_path, monkeypatch):
    """docs/extending.md: "a federation with its own client split is built in `_build` there". Done so, every
    run of it died before round 1 with a bare "unknown dataset 'blobs'" from `_cache_key`, which knew only
    the built-in names."""
    add_own_split_dataset(monkeypatch)
    cfg = validate({"dataset": "blobs", "num-clients": 4, "num-rounds": 2, "results-dir": str(tmp_path),
                    "run-name": "blobs"})
    out = run_inprocess(cfg, console=QUIET)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]


def test_own_split_federation_with_more_clients_than_num_clients_is_refused(tmp_path, monkeypatch):
    """num-clients = 2 on a 4-client federation of its own ran on clients 0 and 1 only, half its data silently
    left out; only the released federations were checked (by name)."""
    add_own_split_dataset(monkeypatch)
    cfg = validate({"dataset": "blobs", "num-clients": 2, "num-rounds": 1, "results-dir": str(tmp_path),
                    "run-name": "short"})
    with pytest.raises(ConfigError, match="federation has 4 clients; set num-clients = 4"):
        run_inprocess(cfg, console=QUIET)
