"""Accuracy against epsilon for the zcdp-adult sweep (with vs without secure aggregation).

    python presets/repro/zcdp-adult/plot_epsilon.py [results/repro/zcdp-adult]

Reads the suite's finished runs (suite.json's cells and seeds, as `privfed report` does; without a
suite.json, its report.csv, written by `privfed repro zcdp-adult`) and writes
plots/accuracy_vs_epsilon.png beside it: one line per sweep row (LR and NN, with
and without SA; mean +- std over the finished seeds), the (10, 1e-4) cells of
Exp. B as points and the non-private rows as dashed lines. Prints the
with-minus-without difference of the means at every epsilon (the paper's claim
is that it is positive everywhere: over the suite's planned eps columns, so an epsilon
whose arm has no run or fewer seeds than planned, from suite.json or else the most
seeds in report.csv, makes the verdict "incomplete") and, per epsilon, on how many seeds the run
with SA beat / tied the run without (over suite.json's finished seeds of the cell, as the means; same
seed: same devices, selection, batches and standard-normal noise draws, only sigma differs). Last, the
issue's other claim: LR at (10, 1e-4) (ours, with SA) within 2 points of non-private LR.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: server.report
from server.report import collect, read_snapshot  # noqa: E402


def paired(with_sa, without) -> str:
    """On how many seeds the run with SA beat / tied the run without: the cells' finished seeds, as in
    report.csv's means (collect: the snapshot's seeds, `run_is_finished`)."""
    if with_sa is None or without is None:
        return "seeds unknown: no suite.json"
    a, b = dict(zip(with_sa.seeds, with_sa.values)), dict(zip(without.seeds, without.values))
    seeds = sorted(set(a) & set(b))
    wins, ties = sum(a[s] > b[s] for s in seeds), sum(a[s] == b[s] for s in seeds)
    return f"{wins}/{len(seeds)} seeds" + (f" ({ties} tied)" if ties else "")


def seed_counts(pts) -> str:
    """The seeds behind a curve's points: one number, or each point's where they differ."""
    counts = sorted({n for _, (_, _, n) in pts})
    return str(counts[0]) if len(counts) == 1 else "/".join(str(n) for _, (_, _, n) in pts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="results/repro/zcdp-adult", help="the suite's results folder")
    folder = Path(ap.parse_args().folder)
    if not (folder / "suite.json").is_file() and not (folder / "report.csv").is_file():
        print(f"plot_epsilon: no suite results in {folder}: run `privfed repro zcdp-adult` first", file=sys.stderr)
        return 2
    rows: dict[str, dict[str, tuple[float, float, int]]] = {}
    seeds: dict[tuple[str, str], int] = {}  # (row, column) -> finished seeds, every cell of the suite
    results = {}  # (row, column) -> CellResult, for the means and the per-seed comparison
    if (folder / "suite.json").is_file():  # the runs themselves: a report.csv may predate the snapshot's runs
        results = {(r.cell.row, r.cell.column): r for r in collect(read_snapshot(folder), folder)}
        for (row, column), r in results.items():
            seeds[row, column] = r.n
            if r.n:
                rows.setdefault(row, {})[column] = (r.mean, r.std or 0.0, r.n)
    else:
        with (folder / "report.csv").open() as fh:
            for rec in csv.DictReader(fh):
                seeds[rec["row"], rec["column"]] = int(rec["n_seeds"] or 0)
                if rec["ours_mean"]:
                    rows.setdefault(rec["row"], {})[rec["column"]] = (
                        float(rec["ours_mean"]), float(rec["ours_std"] or 0), int(rec["n_seeds"]))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, model in zip(axes, ("LR", "NN")):
        for row, cols in rows.items():
            if not row.startswith(model):
                continue
            pts = sorted((float(re.sub("eps=", "", c)), v) for c, v in cols.items() if c.startswith("eps="))
            if "sweep" in row and pts:
                xs = [p[0] for p in pts]
                ax.errorbar(xs, [p[1][0] for p in pts], yerr=[p[1][1] for p in pts], marker="o", capsize=3,
                            label=f"{row} (n={seed_counts(pts)})")
            elif "non-private" in row and "non-private" in cols:
                ax.axhline(cols["non-private"][0], ls="--", color="gray", label=row)
            elif pts:
                ax.errorbar([p[0] for p in pts], [p[1][0] for p in pts], yerr=[p[1][1] for p in pts], marker="s",
                            ls="none", capsize=3, label=row)
        ax.set_xlabel("epsilon (delta = 1e-4)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{model}: accuracy vs epsilon")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out = folder / "plots" / "accuracy_vs_epsilon.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    if results:
        planned = {cell: len(r.cell.seeds) for cell, r in results.items()}
    else:
        planned = dict.fromkeys(seeds, max(seeds.values(), default=0))
    for row in dict.fromkeys(r for r, _ in planned):
        row_without = row.replace("with SA", "without SA")
        if "with SA" not in row or not any(r == row_without for r, _ in planned):
            continue
        with_sa, without = rows.get(row, {}), rows.get(row_without, {})
        columns = sorted({c for r, c in planned if r in (row, row_without) and c.startswith("eps=")},
                         key=lambda c: float(c[4:]))
        short = [c for c in columns if any((r, c) not in planned or seeds.get((r, c), 0) < planned[r, c]
                                           for r in (row, row_without))]
        diffs = {c: with_sa[c][0] - without[c][0] for c in columns if c in with_sa and c in without}
        line = ", ".join(f"{c}: {diffs[c]:+.2f} [{paired(results.get((row, c)), results.get((row_without, c)))}]"
                         if c in diffs else f"{c}: incomplete" for c in columns)
        if short:
            verdict = f"incomplete ({', '.join(short)} short of runs or seeds): not established"
        else:
            verdict = ("beats" if diffs and all(d > 0 for d in diffs.values()) else "does NOT beat") + \
                " without at every epsilon"
        print(f"{row.replace('with SA', '').strip()}: with SA minus without (points): {line}  -> with SA {verdict}")
    print(near_non_private(rows, seeds, planned))
    return 0


def near_non_private(rows, seeds, planned) -> str:
    """The issue's other claim: LR at (10, 1e-4) (ours, with SA) ends within 2 points of non-private LR."""
    ours = next((r for r, c in planned if r.startswith("LR ours") and c == "eps=10"), None)
    plain = next((r for r, c in planned if r.startswith("LR non-private")), None)
    if ours is None or plain is None:
        return "LR at (10, 1e-4) vs non-private LR: no such cells in this suite"
    cells = ((ours, "eps=10"), (plain, "non-private"))
    if any(seeds.get(cell, 0) < planned[cell] for cell in cells):
        return "LR at (10, 1e-4) vs non-private LR: incomplete (short of runs or seeds): not established"
    gap = rows[ours]["eps=10"][0] - rows[plain]["non-private"][0]
    return (f"LR at (10, 1e-4) minus non-private LR: {gap:+.2f} points -> "
            + ("within 2 points" if abs(gap) <= 2 else "NOT within 2 points"))


if __name__ == "__main__":
    sys.exit(main())
