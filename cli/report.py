"""`privfed report RESULTS_DIR...`: re-render tables and plots from finished runs.

Each RESULTS_DIR may be

- a suite's results folder (`<out>/<suite>/`, holding `suite.json`): rewrites
  its `report.md`, `report.csv` and `plots/` from the runs found there;
- a run folder (holding `summary.json`), or a folder of run folders: redraws
  each run's `accuracy.png` (and a private run's `accuracy_vs_epsilon.png`)
  and prints one table of all runs.

Folders are searched recursively; runs inside a suite folder belong to its report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="re-render reports and plots from finished runs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="RESULTS_DIR", help="suite results folder, run folder, or a folder of them")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.set_defaults(func=main)


def find(dirs: list[Path]) -> tuple[list[Path], list[Path]]:
    """(suite folders, run folders outside any suite folder) under `dirs`."""
    from server.report import SNAPSHOT_FILE

    suites, runs = [], []
    for base in dirs:
        found_suites = sorted({p.parent for p in base.rglob(SNAPSHOT_FILE)} |
                              ({base} if (base / SNAPSHOT_FILE).is_file() else set()))
        suites += found_suites
        for summary in sorted(base.rglob("summary.json")):
            run = summary.parent
            if not any(s == run or s in run.parents for s in found_suites):
                runs.append(run)
    return list(dict.fromkeys(suites)), list(dict.fromkeys(runs))


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from cli.repro import _print_table
    from cli.run import print_epsilon_notes, read_summary
    from server.report import render_report

    console = Console(highlight=False)
    missing = [d for d in args.dirs if not Path(d).is_dir()]
    if missing:
        print(f"privfed report: error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    suites, runs = find([Path(d).expanduser().resolve() for d in args.dirs])
    if not suites and not runs:
        print(f"privfed report: error: no finished runs (summary.json) or suites (suite.json) under "
              f"{', '.join(args.dirs)}", file=sys.stderr)
        return 2
    reported, shown = 0, []
    for suite_dir in suites:
        try:
            md, results = render_report(suite_dir, plots=not args.no_plots)
        except (OSError, ValueError, KeyError, TypeError) as err:  # ConfigError and JSONDecodeError too
            print(f"privfed report: skipped suite {suite_dir}: unreadable suite.json or run results ({err})",
                  file=sys.stderr)
            continue
        reported += 1
        console.print(f"[bold]{suite_dir.name}[/]")
        _print_table(console, results)
        console.print(f"privfed report: {md} and {md.with_suffix('.csv')}")
    if runs:
        table = Table(title="runs", title_justify="left")
        for col in ("run", "seed", "accuracy", "loss", "epsilon", "rounds", "seconds"):
            table.add_column(col, justify="left" if col == "run" else "right", overflow="fold")
        for run in runs:
            try:
                s = read_summary(run)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # one damaged run: skip it
                print(f"privfed report: skipped {run}: unreadable summary.json or metrics.jsonl ({err})",
                      file=sys.stderr)
                continue
            shown.append(s)
            if not args.no_plots and (run / "metrics.jsonl").is_file():
                try:
                    _plot(run)
                except OSError as err:  # a full or read-only disk: the table still shows the run
                    print(f"privfed report: no plot for {run}: {err.strerror or err}", file=sys.stderr)
                except (ValueError, TypeError, KeyError) as err:  # a damaged metrics.jsonl line
                    print(f"privfed report: no plot for {run}: unreadable metrics.jsonl ({err})", file=sys.stderr)
            fmt = lambda v, spec=".4f": "-" if v is None else format(v, spec)  # noqa: E731
            table.add_row(str(run), str(s["seed"]), fmt(s["accuracy"]), fmt(s["loss"]), fmt(s["epsilon"], ".3f"),
                          str(s["rounds"]), fmt(s["wall"], ".1f"))
        console.print(table)
        print_epsilon_notes(console, shown)
    return 0 if reported + len(shown) else 1  # everything found was unreadable


def _plot(run: Path) -> None:
    """Redraw the run's plots, as the run drew them: accuracy per round, and for a private run against epsilon."""
    from server.results import plot_accuracy, plot_accuracy_vs_epsilon, read_rows

    config = json.loads((run / "summary.json").read_text()).get("config", {})
    rows = read_rows(run)
    title = f"{config.get('strategy')} on {config.get('dataset')}"
    if rows:
        plot_accuracy(rows, run / "accuracy.png", title)
    if rows and all("epsilon_max" in row for row in rows):
        plot_accuracy_vs_epsilon(rows, run / "accuracy_vs_epsilon.png", title)
