"""`privfed repro` and `privfed report` on a tiny suite: report.csv columns,
aggregation, skip-on-rerun, filters, parallel jobs and suite-file errors."""

import csv
import json
import math
import textwrap

import numpy as np
import pytest

from cli.main import main
from common.config import ConfigError
from server.report import CSV_COLUMNS, METRICS, available_suites, collect, expected_config, load_suite, render_report

SUITE = textwrap.dedent("""
    [suite]
    name = "tiny"
    description = "two cells, two seeds"
    seeds = [1, 2]
    scale = 100.0
    [suite.overrides]
    num-clients = 3
    num-rounds = 2
    [[cell]]
    row = "FedAvg"
    column = "Syn(0,0)"
    overrides = { synthetic-alpha = 0.0, synthetic-beta = 0.0 }
    paper = 80.0
    paper-std = 1.5
    [[cell]]
    row = "FedAvg"
    column = "Syn(1,1)"
    overrides = { synthetic-alpha = 1.0, synthetic-beta = 1.0 }
""")


@pytest.fixture()
def suite_dir(tmp_path):
    folder = tmp_path / "suites" / "tiny"
    folder.mkdir(parents=True)
    (folder / "suite.toml").write_text(SUITE)
    return folder


def repro(capsys, *argv):
    code = main(["repro", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def read_csv(path):
    with path.open() as fh:
        return list(csv.reader(fh))


def test_suite_runs_reports_and_skips_on_rerun(capsys, suite_dir, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = repro(capsys, suite_dir, "--out", out_dir)
    assert code == 0, err
    root = out_dir / "tiny"
    runs = sorted(p.parent.relative_to(root).as_posix() for p in root.glob("*/s*/summary.json"))
    assert runs == ["FedAvg__Syn-0-0/s1", "FedAvg__Syn-0-0/s2", "FedAvg__Syn-1-1/s1", "FedAvg__Syn-1-1/s2"]
    rows = read_csv(root / "report.csv")
    assert tuple(rows[0]) == CSV_COLUMNS == ("suite", "row", "column", "ours_mean", "ours_std", "n_seeds", "paper",
                                             "diff")
    body = {(r[1], r[2]): dict(zip(rows[0], r)) for r in rows[1:]}
    first = body[("FedAvg", "Syn(0,0)")]
    finals = [json.loads((root / "FedAvg__Syn-0-0" / f"s{s}" / "summary.json").read_text())["final"]["accuracy"] * 100
              for s in (1, 2)]
    assert first["suite"] == "tiny" and first["n_seeds"] == "2"
    assert float(first["ours_mean"]) == pytest.approx(np.mean(finals), abs=1e-3)
    assert float(first["ours_std"]) == pytest.approx(np.std(finals), abs=1e-3)
    assert float(first["paper"]) == 80.0
    assert float(first["diff"]) == pytest.approx(np.mean(finals) - 80.0, abs=1e-3)
    assert body[("FedAvg", "Syn(1,1)")]["paper"] == "" and body[("FedAvg", "Syn(1,1)")]["diff"] == ""
    md = (root / "report.md").read_text()
    assert "| FedAvg |" in md and "(80.00 ± 1.50)" in md and "suite wall time" in md
    assert (root / "plots" / "ours_vs_paper.png").is_file()
    assert len(list((root / "plots").glob("curves_*.png"))) == 2

    stamps = {p: p.stat().st_mtime_ns for p in root.glob("*/s*/summary.json")}
    code, out, err = repro(capsys, suite_dir, "--out", out_dir)
    assert code == 0, err
    assert "0 run(s) executed, 4 skipped" in out
    assert {p: p.stat().st_mtime_ns for p in root.glob("*/s*/summary.json")} == stamps

    # `privfed report` re-renders from the results alone
    (root / "report.csv").unlink()
    code = main(["report", str(out_dir)])
    assert code == 0
    assert read_csv(root / "report.csv") == rows


def test_filter_seeds_jobs_and_stale_runs(capsys, suite_dir, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = repro(capsys, suite_dir, "--out", out_dir, "--filter", "(1,1)", "--seeds", "1", "--jobs", "2")
    assert code == 0, err
    root = out_dir / "tiny"
    assert sorted(p.parent.relative_to(root).as_posix() for p in root.glob("*/s*/summary.json")) == [
        "FedAvg__Syn-1-1/s1"]
    rows = {(r[1], r[2]): r for r in read_csv(root / "report.csv")[1:]}
    assert rows[("FedAvg", "Syn(1,1)")][5] == "1" and rows[("FedAvg", "Syn(0,0)")][5] == "0"
    parallel = json.loads((root / "FedAvg__Syn-1-1/s1/summary.json").read_text())["final"]

    # edit the suite: the old run no longer matches its cell, so it is redone (sequentially, same numbers)
    (suite_dir / "suite.toml").write_text(SUITE.replace("num-rounds = 2", "num-rounds = 1"))
    stale = next(r for r in collect(load_suite(str(suite_dir)), root) if r.cell.column == "Syn(1,1)")
    assert stale.n == 0 and stale.notes == ["seed 1: its run was made with another config (stale); not counted"]
    code, out, err = repro(capsys, suite_dir, "--out", out_dir, "--filter", "(1,1)", "--seeds", "1")
    assert code == 0 and "1 run(s) executed, 0 skipped" in out
    (suite_dir / "suite.toml").write_text(SUITE)
    code, out, err = repro(capsys, suite_dir, "--out", out_dir, "--filter", "(1,1)", "--seeds", "1")
    assert code == 0 and "1 run(s) executed, 0 skipped" in out
    assert json.loads((root / "FedAvg__Syn-1-1/s1/summary.json").read_text())["final"] == parallel


def test_unknown_suite_lists_existing(capsys):
    code, out, err = repro(capsys, "no-such-suite")
    assert code == 2 and "unknown suite 'no-such-suite'" in err and "smoke" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "smoke" in available_suites()


def test_suite_file_errors(tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "suite.toml").write_text(SUITE.replace("synthetic-alpha = 0.0,", "synthetic-alfa = 0.0,"))
    with pytest.raises(ConfigError, match="synthetic-alfa"):
        load_suite(str(folder))
    code, _, err = repro(capsys, folder)
    assert code == 2 and "synthetic-alfa" in err
    (folder / "suite.toml").write_text(SUITE.replace('scale = 100.0', 'scale = 100.0\nmetrik = "x"'))
    with pytest.raises(ConfigError, match="metrik"):
        load_suite(str(folder))
    (folder / "suite.toml").write_text(SUITE.replace('scale = 100.0', 'metric = "accuracy-at-epsilon"'))
    with pytest.raises(ConfigError, match="metric-param"):
        load_suite(str(folder))
    code, _, err = repro(capsys, tmp_path / "bad", "--filter", "nothing-matches")
    assert code == 2


def test_smoke_suite_loads():
    suite = load_suite("smoke")
    assert len(suite.cells) == 4 and suite.seeds == (1, 2)
    assert suite.with_seed_count(3).seeds == (1, 2, 3)


def test_accuracy_at_epsilon_is_the_last_round_within_the_budget():
    """The model a run had released within epsilon 1 is round 1's (epsilon 0.4); round 2's cost 1.1."""
    fn = METRICS["accuracy-at-epsilon"].fn
    rows = [{"round": 1, "accuracy": 0.5, "epsilon": 0.4}, {"round": 2, "accuracy": 0.6, "epsilon": 1.1},
            {"round": 3, "accuracy": 0.7, "epsilon": 1.6}]
    assert fn(rows, {}, 1.0) == (0.5, None)
    assert fn(rows, {}, 1.1) == (0.6, None)
    value, note = fn(rows, {}, 5.0)
    assert value == 0.7 and "never reached" in note
    value, note = fn(rows, {}, 0.3)
    assert math.isnan(value) and "first round" in note
    value, note = fn([{"round": 1, "accuracy": 0.5}], {}, 1.0)
    assert math.isnan(value) and "no epsilon" in note


def test_every_shipped_suite_loads_and_validates():
    """Each presets/repro suite (generated or not) parses, and every cell's run config passes the schema."""
    names = available_suites()
    assert {"zcdp-adult", "zcdp-adult/tuning", "ali-table2", "fedlap-table1", "upcycled-table1"} <= set(names)
    for name in names:
        suite = load_suite(name)
        assert suite.cells and suite.seeds, name


def one_cell_runs(tmp_path, runs: dict[int, tuple[dict, list[dict]]], suite_text: str = SUITE):
    """The tiny suite's first cell with the given seed -> (summary fields, metrics rows) runs."""
    folder = tmp_path / "suites" / "tiny"
    folder.mkdir(parents=True)
    (folder / "suite.toml").write_text(suite_text)
    suite = load_suite(str(folder))
    cell = suite.cells[0]
    out = tmp_path / "out" / suite.name
    for seed, (summary, rows) in runs.items():
        run = out / cell.folder / f"s{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"config": expected_config(cell, seed), **summary}))
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, suite


# --- n_seeds and null epsilons (review, session 12) ------------------------------------
def test_report_n_seeds_is_the_number_of_runs_in_the_mean(tmp_path):
    """Seed 2 diverged: its final loss is NaN, written as null. The mean (1.0) is over seed 1 only, yet
    report.csv says n_seeds = 2 and report.md shows no [n=1]: the diverged run silently leaves the mean."""
    out, suite = one_cell_runs(tmp_path, {seed: ({}, [{"round": 2, "accuracy": 0.5, "loss": loss}])
                                          for seed, loss in ((1, 1.0), (2, None))},
                               SUITE.replace("scale = 100.0", 'metric = "final-loss"'))
    render_report(out, suite, plots=False)
    with (out / "report.csv").open() as fh:
        row = next(csv.DictReader(fh))
    assert row["ours_mean"] == "" or int(row["n_seeds"]) == 1, row


def test_accuracy_at_epsilon_reads_a_null_epsilon_as_infinite(tmp_path):
    """metrics.jsonl writes a non-finite epsilon as null (server/results.py _clean). After round 1 (epsilon
    0.5) the epsilon is infinite, so round 1 is the last round within epsilon 1, whatever the accuracy later."""
    rows = [{"round": 1, "accuracy": 0.4, "epsilon_max": 0.5}, {"round": 2, "accuracy": 0.6, "epsilon_max": None},
            {"round": 3, "accuracy": 0.7, "epsilon_max": None}]
    value, note = METRICS["accuracy-at-epsilon"].fn(rows, {}, 1.0)
    assert math.isclose(value, 0.4) and note is None, (value, note)


def test_the_difference_table_marks_a_mean_over_fewer_seeds_than_planned(tmp_path):
    out, suite = one_cell_runs(tmp_path, {1: ({}, [{"round": 2, "accuracy": 0.79, "loss": 1.0}])})  # no seed 2
    md, _ = render_report(out, suite, plots=False)
    difference = md.read_text().split("## Difference")[1]
    assert "-1.00 [n=1]" in difference, difference


def test_epsilon_notes_name_their_cells_when_they_differ():
    """An accuracy-at-epsilon report states each epsilon note once; a note only some cells make names them."""
    from server.report import Cell, CellResult, _epsilon_notes

    def result(row, *notes):
        return CellResult(Cell(row, "c", {}, (1,)), epsilon_notes=list(notes))

    shared, pld = "epsilon from the rdp accountant", "epsilon from the pld accountant"
    lines = _epsilon_notes([result("a", shared), result("b", shared, pld), result("empty")])
    assert lines == [f"- {shared}", f"- {pld} (b / c)"], lines


# --- rounds eval-every skipped, runs that ended early (review of session 19) ---------------------------
def eval_every_rows():
    """eval-every = 2: rounds 1 and 3 are not evaluated; their accuracy repeats the last evaluation (round 1:
    the initial model's)."""
    row = {"loss": 1.0, "accountant": "rdp", "delta": 1e-5}
    return [{**row, "round": 1, "accuracy": 0.06, "epsilon_max": 2.13, "evaluated": False},
            {**row, "round": 2, "accuracy": 0.50, "epsilon_max": 2.41, "evaluated": True},
            {**row, "round": 3, "accuracy": 0.50, "epsilon_max": 2.60, "evaluated": False},
            {**row, "round": 4, "accuracy": 0.70, "epsilon_max": 2.75, "evaluated": True}]


def plotted_points(monkeypatch, draw) -> list[tuple[float, float]]:
    """Every (x, y) of every line the figures `draw` saves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure

    points: list[tuple[float, float]] = []

    def capture(fig, *args, **kwargs):
        for ax in fig.axes:
            for line in ax.get_lines():
                points.extend(zip(map(float, line.get_xdata()), map(float, line.get_ydata())))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", capture)
    draw()
    return points


def test_accuracy_at_a_round_that_was_not_evaluated_is_no_value():
    value, note = METRICS["accuracy-at-round"].fn(eval_every_rows(), {}, 3.0)
    assert math.isnan(value) and "not evaluated" in note, (value, note)


def test_run_plots_draw_only_evaluated_rounds(monkeypatch, tmp_path):
    """Round 1's row holds the initial model's accuracy beside the epsilon after round 1, round 3's a copy of
    round 2's: points no model had."""
    from server.results import plot_accuracy, plot_accuracy_vs_epsilon

    rows = eval_every_rows()
    points = plotted_points(monkeypatch, lambda: plot_accuracy_vs_epsilon(rows, tmp_path / "e.png", "t"))
    assert points == [(2.41, 0.50), (2.75, 0.70)], points
    points = plotted_points(monkeypatch, lambda: plot_accuracy(rows, tmp_path / "a.png", "t"))
    assert points == [(2.0, 0.50), (4.0, 0.70)], points


def test_report_curves_draw_only_evaluated_rounds(monkeypatch, tmp_path):
    out, suite = one_cell_runs(tmp_path, {1: ({}, eval_every_rows())})
    points = plotted_points(monkeypatch, lambda: render_report(out, suite, plots=True))
    curve = [p for p in points if p[0] in (1.0, 2.0, 3.0, 4.0) and p[1] < 100.5]  # not the ours-vs-paper axes
    assert (2.0, 50.0) in curve and (1.0, 6.0) not in curve and (3.0, 50.0) not in curve, curve


def test_report_notes_a_seed_whose_run_ended_before_its_planned_rounds(tmp_path):
    """Seed 1 ended after round 1 of 2 (every client retired): its final model is round 1's, averaged with
    seed 2's round-2 model; the report must say so."""
    rows = [{"round": r, "accuracy": 0.5, "loss": 1.0} for r in (1, 2)]
    out, suite = one_cell_runs(tmp_path, {1: ({"rounds": 1, "planned_rounds": 2}, rows[:1]),
                                          2: ({"rounds": 2, "planned_rounds": 2}, rows)})
    md, _ = render_report(out, suite, plots=False)
    assert "seed 1: ended after round 1 of 2" in md.read_text().split("## Notes")[1]


def test_a_curve_cut_to_its_shortest_seed_says_so(monkeypatch, tmp_path):
    """Seed 1 ended after round 1 of 2: the cell's curve stops at round 1, and its legend says why."""
    import matplotlib
    import matplotlib.figure

    rows = [{"round": r, "accuracy": 0.5, "loss": 1.0} for r in (1, 2)]
    out, suite = one_cell_runs(tmp_path, {1: ({"rounds": 1, "planned_rounds": 2}, rows[:1]),
                                          2: ({"rounds": 2, "planned_rounds": 2}, rows)})
    matplotlib.use("Agg")
    labels = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: labels.extend(
        line.get_label() for ax in fig.axes for line in ax.get_lines()))
    render_report(out, suite, plots=True)
    assert any("cut at round 1: its shortest seed" in label for label in labels), labels


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_accuracy_at_epsilon_measures_an_evaluated_round_and_says_which():
    """eval-every > 1: a row between evaluations carries an earlier round's accuracy (evaluated: false).
    accuracy-at-epsilon returned round 4's copied value silently as its own."""
    rows = [{"round": r, "accuracy": a, "epsilon_max": e, "evaluated": ev} for r, a, e, ev in
            [(1, 0.3, 0.5, False), (2, 0.3, 1.0, False), (3, 0.6, 1.5, True), (4, 0.6, 2.0, False),
             (5, 0.9, 2.5, True)]]
    value, note = METRICS["accuracy-at-epsilon"].fn(rows, {}, 2.2)
    assert value == 0.6 and note == ("round 4, the last within epsilon 2.2, was not evaluated (eval-every): "
                                     "round 3's accuracy")
    value, note = METRICS["accuracy-at-epsilon"].fn(rows, {}, 1.2)
    assert math.isnan(value) and "no round within epsilon 1.2 was evaluated" in note
