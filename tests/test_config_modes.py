"""The run-config mode table (common/config.py `_MODES`): a key outside its mode is refused when given, and
dropped where a config is derived from another (a preset, a suite, a finished run from before the table):
the project's own tools build such configs (a review found five that the table's first version broke)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from common.config import ConfigError
from server.report import load_suite

ROOT = Path(__file__).resolve().parents[1]


class Reached(Exception):
    """The code under test got past config validation."""


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # a script's folder is on its path (benchmarks/arguments.py)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def test_suite_snapshot_from_before_the_mode_table_still_reports(tmp_path):
    """A suite.json written before this change holds the cells' merged overrides unpruned (e.g. every vanilla
    row of upcycled-table1 carries upcycled-theta = 0.7, ali-table7's FedAvg rows carry ali-gamma). `privfed
    report` re-renders from that snapshot: expected_config -> validate now raises ConfigError for such a cell."""
    from common.config import defaults
    from server.report import load_suite, render_report, write_snapshot

    suite = load_suite("smoke")
    vanilla = next(c for c in suite.cells if not c.overrides.get("upcycled"))
    old = dataclasses.replace(vanilla, overrides={**vanilla.overrides, "upcycled-theta": 0.7})
    suite = dataclasses.replace(suite, cells=tuple(old if c is vanilla else c for c in suite.cells))
    suite_dir = tmp_path / "smoke"
    write_snapshot(suite, suite_dir)
    seed = old.seeds[0]
    run_dir = suite_dir / old.folder / f"s{seed}"  # the run that suite made then: finished, its config recorded
    run_dir.mkdir(parents=True)
    config = {**defaults(), **old.run_overrides(seed, suite_dir)}
    (run_dir / "summary.json").write_text(json.dumps({"config": config, "rounds": 1, "planned_rounds": 1}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.5, "loss": 1.0}) + "\n")
    _, results = render_report(suite_dir, plots=False)
    assert next(r for r in results if r.cell.label == old.label).seeds == [seed]


def test_epsilons_script_reads_a_run_finished_before_the_mode_table(tmp_path, monkeypatch):
    """presets/repro/upcycled-privacy/epsilons.py validates each finished run's summary config; a vanilla
    (upcycled = false) run made by the previous suite recorded upcycled-theta = 0.7 and is now refused."""
    from common.config import defaults

    eps = _load(ROOT / "presets/repro/upcycled-privacy/epsilons.py", "review_epsilons")
    config = {**defaults(), "strategy": "fedavg", "dataset": "syn-iid", "num-clients": 30, "privacy": "output",
              "output-sensitivity": "paper", "upcycled": False, "upcycled-theta": 0.7, "fraction-train": 1.0}
    (tmp_path / "summary.json").write_text(json.dumps({"config": config}))

    def reached(*_a, **_k):
        raise Reached

    monkeypatch.setattr(eps, "ledgers_for", reached)
    with pytest.raises(Reached):
        eps.run_epsilons(tmp_path, 1e-5)


def test_search_clip_documented_iid_partition_validates(monkeypatch):
    """search_clip.py --partition iid ("a diagnosis") always passes dirichlet-alpha (default 0.05), which is
    now refused with partition = 'iid' before any run."""
    mod = _load(ROOT / "presets/repro/ali-table2/search_clip.py", "review_search_clip")

    def reached(*_a, **_k):
        raise Reached

    monkeypatch.setattr(mod, "run_inprocess", reached)
    monkeypatch.setattr(sys, "argv", ["search_clip.py", "--partition", "iid", "--clips", "1", "--rounds", "1"])
    with pytest.raises(Reached):
        mod.main()


def test_fedlap_cost_benchmark_builds_its_fedavg_config(monkeypatch):
    """benchmarks/fedlap_cost.py times FedAvg on the FedLAP preset's data: validate({**preset, strategy =
    'fedavg', ...}) now refuses the preset's fedlap-* keys (every fedlap preset), so the benchmark cannot run."""
    mod = _load(ROOT / "benchmarks/fedlap_cost.py", "review_fedlap_cost")
    import common.data

    def reached(*_a, **_k):
        raise Reached

    monkeypatch.setattr(common.data, "load_federation", reached)
    monkeypatch.setattr(sys, "argv", ["fedlap_cost.py", "--preset", "fedlap-quick"])
    with pytest.raises(Reached):
        mod.main()


def test_upcycled_cost_benchmark_vanilla_run_validates(monkeypatch, tmp_path):
    """benchmarks/upcycled_cost.py runs the same setting with upcycled = true and false; its SETTINGS carry
    upcycled-theta, so the vanilla run's config is now refused."""
    mod = _load(ROOT / "benchmarks/upcycled_cost.py", "review_upcycled_cost")
    import server.inprocess

    def reached(*_a, **_k):
        raise Reached

    monkeypatch.setattr(server.inprocess, "run_inprocess", reached)
    with pytest.raises(Reached):
        mod.one_run("table1", False, 2, "fedavg", tmp_path, seed=0)


def test_a_cell_override_its_run_does_not_read_is_refused_not_dropped(tmp_path):
    """load_suite passes the merged base + suite + cell overrides through drop_unread, which drops every unread
    key, a cell's own included: a cell `overrides = { prox-mu = 0.1 }` on a FedAvg run loads and runs plain
    FedAvg, where `privfed run --set prox-mu=0.1` is refused ("read only with strategy = 'fedprox'")."""
    root = tmp_path / "suites"
    (root / "px").mkdir(parents=True)
    (root / "px" / "suite.toml").write_text(
        '[suite]\nname = "px"\ndescription = "d"\nseeds = [1]\n'
        '[suite.overrides]\ndataset = "synthetic"\nnum-clients = 2\n'
        '[[cell]]\nrow = "R"\ncolumn = "C"\noverrides = { prox-mu = 0.1 }\n')
    with pytest.raises(ConfigError, match="prox-mu"):
        load_suite("px", root=root)
