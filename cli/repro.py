"""`privfed repro`: run a reproduction suite and write its report.

    privfed repro SUITE [--jobs N] [--filter TEXT] [--seeds N] [--out DIR] [--list]

SUITE is a folder under presets/repro/ (or a path to one); its `suite.toml`
lists the cells (row, column, run-config overrides, the paper's number) and
the seeds (format: `server/report.py`). Every (cell, seed) is one in-process
run in `<out>/<suite>/<row>__<column>/s<seed>/`; finished runs (their
`summary.json` exists, written for the same config) are skipped, so an
interrupted suite resumes. The report (`report.md`, `report.csv`, `plots/`)
aggregates the finished runs of every cell's seeds (mean ± std) beside the paper's
number.

`--jobs N` runs N runs at once in worker processes (each with 1 torch
thread); `--filter TEXT` runs only cells whose row or column contains TEXT;
`--seeds N` uses only the first N seeds (quick checks).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_OUT = "results/repro"


@dataclass(frozen=True)
class Job:
    cell: Any  # server.report.Cell
    seed: int
    overrides: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        return Path(self.overrides["results-dir"]) / self.overrides["run-name"]

    @property
    def label(self) -> str:
        return f"{self.cell.label} s{self.seed}"


def run_job(overrides: dict[str, Any], threads: int = 1) -> tuple[str, float | None]:
    """One suite run on the in-process engine; its console output goes to <run>/log.txt.

    Top-level so worker processes can run it. Returns (results folder, seconds; None: another command
    finished the run meanwhile). A run another command holds raises RunFolderInUse.
    """
    from rich.console import Console

    from common.config import validate
    from server.inprocess import quiet_flower, run_inprocess
    from server.report import finished_as
    from server.results import hold_run_folder

    config = validate(overrides)
    run_dir = Path(str(config["results-dir"])) / str(config["run-name"])
    with hold_run_folder(run_dir):  # a run still going there is refused before its files are touched
        if finished_as(run_dir, config):  # another `privfed repro` on this --out finished it meanwhile
            return str(run_dir), None
        for name in ("summary.json", "metrics.jsonl"):  # `plan` found this run stale or unfinished: redone
            (run_dir / name).unlink(missing_ok=True)
        started = time.perf_counter()
        with (run_dir / "log.txt").open("w") as fh, quiet_flower(logging.ERROR):  # no Flower lines over the bar
            console = Console(file=fh, highlight=False, width=120, force_terminal=False, color_system=None)
            result = run_inprocess(config, console=console, threads=threads)
    return str(result), time.perf_counter() - started


def _worker_init() -> None:
    import signal

    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops workers
    torch.set_num_threads(1)  # one run per worker: N jobs use N cores


def plan(suite, out_dir: Path, filter_text: str | None) -> tuple[list[Job], list[Job]]:
    """(jobs to run, jobs already finished) for the matching cells."""
    from server.report import run_is_finished

    suite_dir = out_dir / suite.name
    todo, done = [], []
    for cell in suite.matching(filter_text):
        for seed in cell.seeds:
            job = Job(cell, seed, cell.run_overrides(seed, suite_dir))
            (done if run_is_finished(job.run_dir, cell, seed) else todo).append(job)
    return todo, done


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("repro", help="run a reproduction suite and report ours vs the paper",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", nargs="?", help="suite name (presets/repro/SUITE/) or path to a suite folder")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, in worker processes (default 1)")
    p.add_argument("--filter", help="only cells whose row or column contains this text (case-insensitive)")
    p.add_argument("--seeds", type=int, help="use only the first N seeds of each cell")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})")
    p.add_argument("--list", action="store_true", help="list the suites (or, with SUITE, its cells) and exit")
    p.add_argument("--no-plots", action="store_true", help="write report.md/csv without plots")
    p.set_defaults(func=main)


def _list(suite, cells) -> int:
    """The suites (`suite` None), or the suite's `cells` that a run with the same --filter and --seeds runs."""
    from server.report import available_suites

    if suite is None:
        for name in available_suites():
            print(name)
        return 0
    print(f"{suite.name}: {suite.description}")
    for cell in cells:
        paper = "" if cell.paper is None else f"  paper {cell.paper:g}"
        print(f"  {cell.label}  seeds {','.join(map(str, cell.seeds))}{paper}")
    return 0


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from common.config import ConfigError
    from common.data.errors import DataFileError
    from server.report import available_suites, load_suite, render_report, write_snapshot, write_timing

    console = Console(highlight=False)
    started = time.perf_counter()
    try:
        if args.list and not args.suite:
            return _list(None, [])
        if not args.suite:
            raise ConfigError(f"name a suite; available suites: {', '.join(available_suites()) or '(none)'}")
        if args.jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
        if args.seeds is not None and args.seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
        suite = load_suite(args.suite)
        if args.seeds:
            suite = suite.with_seed_count(args.seeds)
        cells = suite.matching(args.filter)
        if not cells:
            raise ConfigError(f"--filter {args.filter!r} matches no cell of suite {suite.name!r}; cells: "
                              + ", ".join(c.label for c in suite.cells))
        if args.list:
            return _list(suite, cells)
        out_dir = Path(args.out).expanduser().resolve()
        suite_dir = out_dir / suite.name
        todo, done = plan(suite, out_dir, args.filter)
        _preflight(todo)
        write_snapshot(load_suite(args.suite).with_seeds_of(suite), suite_dir)  # the full suite, for `privfed report`
    except (ConfigError, DataFileError) as e:
        print(f"privfed repro: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `--list | head`: cli/main.py ends it quietly
        raise
    except OSError as e:  # --out under a file, or not writable
        print(f"privfed repro: error: cannot write the suite's results under {args.out}: {e.strerror or e}",
              file=sys.stderr)
        return 2

    console.print(f"privfed repro: suite [bold]{suite.name}[/]: {len(cells)} cell(s), "
                  f"{len(todo) + len(done)} run(s): {len(done)} finished, {len(todo)} to run, {args.jobs} job(s); "
                  f"results in {suite_dir}")
    outcome = Outcome()
    try:
        _execute(todo, len(done), args.jobs, console, outcome)
    except KeyboardInterrupt:  # the time spent until then counts in the suite's wall time (the report's total)
        with contextlib.suppress(OSError):
            write_timing(suite_dir, time.perf_counter() - started, executed=outcome.executed, skipped=len(done),
                         failed=len(outcome.failed), jobs=args.jobs, interrupted=True)
        raise
    failed, busy, executed = outcome.failed, outcome.busy, outcome.executed
    wall = time.perf_counter() - started
    try:
        write_timing(suite_dir, wall, executed=executed, skipped=len(done), failed=len(failed), jobs=args.jobs)
        md, results = render_report(suite_dir, plots=not args.no_plots)
    except OSError as e:  # the runs are kept: `privfed report` writes the report once there is room
        print(f"privfed repro: error: the runs are in {suite_dir}, but the report could not be written: "
              f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}", file=sys.stderr)
        return 1
    _print_table(console, results)
    for job, why in failed:
        print(f"privfed repro: run failed: {job.label}: {why}", file=sys.stderr)
    held = f", {len(busy)} left to another command running them" if busy else ""
    console.print(f"privfed repro: {executed} run(s) executed, {len(done)} skipped, {len(failed)} failed{held} "
                  f"in {wall:.1f} s")
    console.print(f"privfed repro: report in {md} and {md.with_suffix('.csv')}")
    return 1 if failed else 0


def _preflight(jobs: list[Job]) -> None:
    """Load each distinct dataset once now: a missing file is one clear error before any run, naming the
    cells that need it."""
    from common.config import validate
    from common.data import load_federation
    from common.data.errors import DataFileError

    by_data: dict[tuple, tuple[Any, set[str]]] = {}  # (dataset, data-dir) -> (a config reading it, its cells)
    for job in jobs:
        config = validate(job.overrides)
        by_data.setdefault((config["dataset"], config["data-dir"]), (config, set()))[1].add(job.cell.label)
    for config, labels in by_data.values():
        try:
            load_federation(config)
        except DataFileError as err:
            cells = sorted(labels)
            named = ", ".join(cells[:3]) + (f" and {len(cells) - 3} more" if len(cells) > 3 else "")
            raise DataFileError(f"cell(s) {named} (--filter runs the others): {err}") from err


@dataclass
class Outcome:
    """What an invocation's runs came to, so far (an interrupted one keeps what it did)."""
    failed: list[tuple[Job, str]] = field(default_factory=list)  # with why
    busy: list[Job] = field(default_factory=list)  # held by another command: reported, not counted as failed
    executed: int = 0


def _execute(todo: list[Job], skipped: int, jobs: int, console, outcome: Outcome) -> None:
    """Run `todo`, recording each run's end in `outcome`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from server.results import RunFolderInUse

    failed, busy = outcome.failed, outcome.busy
    total = len(todo) + skipped
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())

    def described(running: str = "") -> str:  # the bar counts runs ended; what did not end well, it says
        said = ([running] if running else []) + ([f"{len(failed)} failed"] if failed else []) \
            + ([f"{len(busy)} busy"] if busy else [])
        return f"runs ({', '.join(said)})" if said else "runs"

    def finished(job: Job, result: tuple[str, float | None] | None, error: BaseException | None):
        if isinstance(error, RunFolderInUse):  # neither failed nor done here: the next invocation counts it
            busy.append(job)
            progress.console.print(f"  busy {job.label}: another command is running it", highlight=False)
        elif error is not None:
            why = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            failed.append((job, why))
            progress.console.print(f"  [red]failed[/] {job.label}: {why}", markup=True, highlight=False)
        elif result[1] is None:
            progress.console.print(f"  done {job.label} by another command", highlight=False)
        else:
            outcome.executed += 1
            acc = _final_accuracy(Path(result[0]))
            progress.console.print(f"  done {job.label}: accuracy {acc}  ({result[1]:.1f} s)", highlight=False)
        progress.update(task, advance=1, description=described())

    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("runs", total=total, completed=skipped)
        if jobs == 1:
            for job in todo:
                progress.update(task, description=described(job.label))
                try:
                    result = run_job(job.overrides)
                except Exception as e:  # noqa: BLE001 (a failed run is reported, the suite goes on)
                    if os.environ.get("PRIVFED_DEBUG"):
                        raise
                    finished(job, None, e)
                else:
                    finished(job, result, None)
            return
        queue = list(todo)
        while queue:
            suspects, queue = _in_pool(queue, jobs, finished)
            for job in suspects:  # a worker died (out of memory?) under one of them: each alone finds which
                if _in_pool([job], 1, finished)[0]:
                    finished(job, None, RuntimeError("its worker process died (killed, e.g. out of memory)"))


def _in_pool(todo: list[Job], workers: int, finished) -> tuple[list[Job], list[Job]]:
    """Run `todo` in a pool of `workers` processes, at most one run each, calling `finished` on each run
    done. A worker that dies breaks the pool and the executor kills the others: then return (the runs in
    flight, which are to be redone, the runs not started), else ([], [])."""
    ctx = multiprocessing.get_context("spawn")  # torch and fork do not mix
    queue, running = list(todo), {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init) as pool:
        try:
            while queue or running:
                while queue and len(running) < workers:
                    job = queue.pop(0)
                    running[pool.submit(run_job, job.overrides)] = job
                ready, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in ready:
                    if not isinstance(fut.exception(), BrokenProcessPool):
                        job, e = running.pop(fut), fut.exception()
                        finished(job, None if e else fut.result(), e)
                if running.keys() & ready:  # what is left of `ready` broke with the pool
                    return list(running.values()), queue
        except KeyboardInterrupt:  # leaving the block would wait for the runs under way: stop them
            for proc in (pool._processes or {}).values():  # private, but the only handle on a worker
                proc.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [], []


def _final_accuracy(run_dir: Path) -> str:
    import json

    try:
        acc = json.loads((run_dir / "summary.json").read_text())["final"]["accuracy"]
        return "not finite" if acc is None else f"{acc:.4f}"
    except (OSError, KeyError, TypeError, ValueError):
        return "?"


def _print_table(console, results) -> None:
    from rich.table import Table

    table = Table(title="ours vs paper", title_justify="left")
    for name in ("row", "column", "ours", "n", "paper", "diff"):
        table.add_column(name, justify="left" if name in ("row", "column") else "right")
    for r in results:
        d = 2 if abs(r.scale) >= 10 else 4
        ours = "-" if r.mean is None else f"{r.mean:.{d}f} ± {r.std:.{d}f}"
        paper = "-" if r.cell.paper is None else f"{r.cell.paper:.{d}f}"
        diff = "-" if r.diff is None else f"{r.diff:+.{d}f}"
        table.add_row(r.cell.row, r.cell.column, ours, str(r.n), paper, diff)
    console.print(table)
