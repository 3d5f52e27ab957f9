"""Reproduction suites: the suite file format, aggregation over seeds, and the
report (`report.md`, `report.csv`, plots).

A suite is a folder `presets/repro/SUITE/` holding `suite.toml`:

    [suite]
    name = "smoke"                   # optional; default: the folder name
    description = "..."              # one paragraph, shown in the report
    source = "Upcycled-FL, Table 1"  # optional: where the paper numbers come from
    seeds = [1, 2, 3]                # one run per seed per cell
    base = "fedavg-syn-iid"          # optional: a preset name (presets/NAME.toml) or a path
                                     # relative to this folder; applied first
    metric = "final-accuracy"        # what a run contributes; see METRICS below
    metric-param = 1.0               # for metrics that take one (accuracy-at-epsilon: the epsilon)
    scale = 100.0                    # ours * scale is compared with the paper (100: paper in %)
    rows = ["FedAvg", "Upc-FedAvg"]  # optional: row order (default: first appearance)
    columns = ["Syn(iid)", "Syn(0,0)"]  # optional: column order

    [suite.overrides]                # run-config overrides for every cell (after base) that reads them
    num-rounds = 80

    [[cell]]
    row = "FedAvg"
    column = "Syn(iid)"
    preset = "cells/x.toml"          # optional: more overrides from a file (relative to this folder)
    overrides = { dataset = "syn-iid" }  # this cell's (applied last; one it does not read is refused)
    paper = 98.06                    # the paper's number (omit when the paper has none)
    paper-std = 0.07                 # optional
    seeds = [1, 2]                   # optional: this cell's own seeds
    note = "..."                     # optional: shown under the tables

Every cell's config is validated when the suite loads, so a typo stops the
suite before any run. Runs go to `<out>/<suite>/<row>__<column>/s<seed>/`
(names made file-safe); a run is finished when its `summary.json` exists and
its config is the cell's (a stale run from an edited suite is redone).
`<out>/<suite>/suite.json` snapshots the suite so `privfed report` can
re-render without the TOML.

Aggregation: mean and population std (ddof = 0, numpy's default, as the
papers' code computes it) of the metric over the cell's finished seeds.
"""

from __future__ import annotations

import csv
import json
import math
import re
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from common.config import SCHEMA, ConfigError, defaults, drop_unread, is_inert, validate
from common.durable import write_atomically
from common.number_checks import is_int, is_real
from server.results import is_measured

APP_DIR = Path(__file__).resolve().parents[1]
PRESETS_DIR = APP_DIR / "presets"
REPRO_DIR = PRESETS_DIR / "repro"
SUITE_FILE = "suite.toml"
SNAPSHOT_FILE = "suite.json"
TIMING_FILE = "timing.json"
CSV_COLUMNS = ("suite", "row", "column", "ours_mean", "ours_std", "n_seeds", "paper", "diff")
# Keys that may differ between a run and its cell without making it another run.
RUN_KEYS = ("seed", "run-name", "results-dir", "data-dir")


# --- metrics -------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    fn: Callable[[list[dict], dict, float | None], tuple[float, str | None]]
    doc: str
    needs_param: bool = False


def _measured(row: Mapping[str, Any], key: str) -> float:
    """A row's number; NaN where results files hold null (a diverged model's NaN accuracy and loss)."""
    return math.nan if row.get(key) is None else float(row[key])


def _final(key: str):
    def fn(rows, summary, param):
        return (_measured(rows[-1], key) if rows else math.nan), None
    return fn


def _best_accuracy(rows, summary, param):
    values = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
    return (max(values) if values else math.nan), None


def _accuracy_at_round(rows, summary, param):
    for r in rows:
        if r["round"] == int(param):
            if r.get("evaluated") is False:  # eval-every > 1: its accuracy is a copy of an earlier round's
                return math.nan, f"round {int(param)} was not evaluated (eval-every)"
            return _measured(r, "accuracy"), None
    return math.nan, f"round {int(param)} not reached"


def row_epsilon(row: Mapping[str, Any]) -> float | None:
    """The epsilon spent after a round (`epsilon`, else the max over clients `epsilon_max`), if reported;
    results files write an unbounded epsilon as null, read here as inf."""
    for key in ("epsilon", "epsilon_max"):
        if key in row:
            return math.inf if row[key] is None else float(row[key])
    return None


def epsilon_note(summary: Mapping[str, Any]) -> str | None:
    """What a private run's epsilon states: delta, accountant, neighbouring relation and sampling."""
    privacy = summary.get("privacy") or {}
    if "delta" not in privacy:
        return None
    config = summary.get("config", {})
    relations = sorted({r for ledger in privacy.get("ledgers", {}).values() for r in ledger.get("relations", [])})
    if config.get("privacy") == "dpsgd":
        sampling = f"Poisson sampling (q = {config.get('dp-sample-rate')})"
    else:  # output/objective perturbation, Hu et al.: accounted without amplification by sampling
        sampling = "no amplification by sampling"
    assumptions = sorted({a for ledger in privacy.get("ledgers", {}).values() for a in ledger.get("assumptions", [])})
    caveat = f". NOT A GUARANTEE of this run: it assumes {'; and '.join(assumptions)}" if assumptions else ""
    if config.get("privacy") == "objective":  # pure entries only: no accountant composes them
        guarantee = "pure epsilon-DP (delta = 0), basic composition of the per-round releases"
    else:
        guarantee = f"(epsilon, delta)-DP at delta = {privacy['delta']:g} ({privacy.get('accountant')} accountant)"
    return (f"epsilon: max over clients of record-level {guarantee}; neighbouring relation: "
            f"{', '.join(relations) or 'none recorded'}; {sampling}{caveat}")


def _accuracy_at_epsilon(rows, summary, param):
    """Accuracy of the last round whose epsilon is at most `param`: the model a run had released within
    that budget (a later round's model cost more than the label says)."""
    eps = [(r, row_epsilon(r)) for r in rows]
    known = [e for _, e in eps if e is not None]
    if not known:
        return math.nan, "runs report no epsilon"
    within = [r for r, e in eps if e is not None and e <= param]
    if not within:
        return math.nan, f"epsilon passed {param:g} in the first round ({min(known):.4g})"
    # a label covers every epsilon the paper prints as it (2.795 for "2.79"): within 1 % below it is reached
    notes = [] if max(known) >= 0.99 * param else [f"epsilon never reached {param:g} (max {max(known):.4g})"]
    measured = [r for r in within if r.get("evaluated") is not False]  # eval-every > 1: the others are copies
    if not measured:
        return math.nan, f"no round within epsilon {param:g} was evaluated (eval-every)"
    if measured[-1] is not within[-1]:
        notes.append(f"round {within[-1]['round']}, the last within epsilon {param:g}, was not evaluated "
                     f"(eval-every): round {measured[-1]['round']}'s accuracy")
    return _measured(measured[-1], "accuracy"), "; ".join(notes) or None


METRICS: dict[str, Metric] = {
    "final-accuracy": Metric(_final("accuracy"), "test accuracy after the last round"),
    "final-loss": Metric(_final("loss"), "test loss after the last round"),
    "best-accuracy": Metric(_best_accuracy, "best test accuracy over the rounds"),
    "accuracy-at-round": Metric(_accuracy_at_round, "test accuracy at round metric-param", True),
    "accuracy-at-epsilon": Metric(_accuracy_at_epsilon,
                                  "test accuracy at the last round where epsilon <= metric-param", True),
}


# --- the suite -----------------------------------------------------------------
def slug(text: str) -> str:
    """A file-safe folder name for a row or column label."""
    out = re.sub(r"[^A-Za-z0-9.+-]+", "-", text.strip()).strip("-.")
    return out or "x"


@dataclass(frozen=True)
class Cell:
    row: str
    column: str
    overrides: dict[str, Any]  # base + suite + cell overrides (no seed/run-name/results-dir)
    seeds: tuple[int, ...]
    paper: float | None = None
    paper_std: float | None = None
    note: str = ""

    @property
    def folder(self) -> str:
        return f"{slug(self.row)}__{slug(self.column)}"

    @property
    def label(self) -> str:
        return f"{self.row} / {self.column}"

    def run_overrides(self, seed: int, results_dir: Path) -> dict[str, Any]:
        return {**self.overrides, "seed": seed, "run-name": f"s{seed}", "results-dir": str(results_dir / self.folder)}


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    seeds: tuple[int, ...]
    cells: tuple[Cell, ...]
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    metric: str = "final-accuracy"
    metric_param: float | None = None
    scale: float = 1.0
    source: str = ""
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Suite":
        # a snapshot from before the mode table (common/config.py _MODES) may hold keys its cells do not read
        cells = tuple(Cell(**{**c, "seeds": tuple(c["seeds"]), "overrides": drop_unread(c["overrides"])})
                      for c in data["cells"])
        return cls(**{**data, "cells": cells, "seeds": tuple(data["seeds"]), "rows": tuple(data["rows"]),
                      "columns": tuple(data["columns"])})

    def with_seed_count(self, n: int) -> "Suite":
        """The first `n` seeds of every cell (extended with the next integers if there are fewer)."""
        def first(seeds: tuple[int, ...]) -> tuple[int, ...]:
            out = list(seeds[:n])
            nxt = max(seeds, default=0) + 1
            while len(out) < n:
                out.append(nxt)
                nxt += 1
            return tuple(out)

        cells = tuple(Cell(**{**asdict(c), "seeds": first(c.seeds)}) for c in self.cells)
        return Suite(**{**asdict(self), "cells": cells, "seeds": first(self.seeds)})

    def with_seeds_of(self, other: "Suite") -> "Suite":
        """This suite, each cell also holding the seeds of `other`'s cell (the same suite, with_seed_count'ed):
        the snapshot of a `--seeds N` beyond a cell's own seeds keeps the runs it made in the report."""
        def union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(dict.fromkeys((*a, *b)))

        cells = tuple(Cell(**{**asdict(c), "seeds": union(c.seeds, o.seeds)}) for c, o in zip(self.cells, other.cells,
                                                                                             strict=True))
        return Suite(**{**asdict(self), "cells": cells, "seeds": union(self.seeds, other.seeds)})

    def matching(self, text: str | None) -> list[Cell]:
        """Cells whose 'row', 'column', 'row/column' or 'row / column' (the label --list prints) contains
        `text` (case-insensitive)."""
        if not text:
            return list(self.cells)
        t = text.lower()
        return [c for c in self.cells if any(t in f"{c.row}{sep}{c.column}".lower() for sep in ("/", " / "))
                or t in c.row.lower() or t in c.column.lower()]


def available_suites(root: Path = REPRO_DIR) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.parent.relative_to(root).as_posix() for p in root.rglob(SUITE_FILE))


def suite_file(name: str, root: Path = REPRO_DIR) -> Path:
    """A suite name (presets/repro/NAME) or a path to a suite folder or suite.toml."""
    for candidate in (Path(name).expanduser(), root / name):
        if candidate.is_file() and candidate.suffix == ".toml":
            return candidate.resolve()
        if (candidate / SUITE_FILE).is_file():
            return (candidate / SUITE_FILE).resolve()
    import difflib

    names = available_suites(root)
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(f"unknown suite {name!r} (no {root / name / SUITE_FILE}).{hint} "
                      f"Available suites: {', '.join(names) or '(none)'}; or give a path to a suite folder")


SUITE_KEYS = {"name", "description", "source", "seeds", "base", "overrides", "metric", "metric-param", "scale",
              "rows", "columns"}
CELL_KEYS = {"row", "column", "preset", "overrides", "paper", "paper-std", "seeds", "note"}


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")


def _read_toml(path: Path, where: str) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where}: {path} is not valid TOML ({err})") from None


def _preset_overrides(ref: str, suite_dir: Path, where: str) -> dict[str, Any]:
    name = ref[:-5] if ref.endswith(".toml") else ref
    for path in (suite_dir / ref, Path(ref).expanduser(), PRESETS_DIR / f"{name}.toml"):
        if path.is_file():
            return _read_toml(path, where)
    raise ConfigError(f"{where}: preset {ref!r} not found (looked in {suite_dir} and {PRESETS_DIR})")


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    if (not isinstance(value, list) or not value or
            not all(is_int(s) and s >= 0 for s in value)
            or len(set(value)) != len(value)):
        raise ConfigError(f"{where}: seeds must be a non-empty list of distinct non-negative integers; got {value!r}")
    return tuple(value)


def _overrides_table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table of run-config overrides (key = value), got {value!r}")
    return value


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if not is_real(value):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    return float(value)


def load_suite(name: str, root: Path = REPRO_DIR) -> Suite:
    """Read and validate a suite (every cell's config is checked now)."""
    path = suite_file(name, root)
    data = _read_toml(path, f"suite {name!r}")
    where = f"{path}"
    _check_keys(data, {"suite", "cell"}, where)
    head = data.get("suite")
    if not isinstance(head, dict):
        raise ConfigError(f"{where}: needs a [suite] table")
    _check_keys(head, SUITE_KEYS, f"{where} [suite]")
    if "seeds" not in head:
        raise ConfigError(f"{where} [suite]: 'seeds' is required (e.g. seeds = [1, 2, 3])")
    seeds = _seeds(head["seeds"], f"{where} [suite]")
    metric = str(head.get("metric", "final-accuracy"))
    if metric not in METRICS:
        raise ConfigError(f"{where} [suite]: unknown metric {metric!r}; known: {', '.join(METRICS)}")
    param = _number(head.get("metric-param"), f"{where} [suite] metric-param")
    if METRICS[metric].needs_param and param is None:
        raise ConfigError(f"{where} [suite]: metric {metric!r} needs metric-param")
    scale = _number(head.get("scale", 1.0), f"{where} [suite] scale")
    base: dict[str, Any] = {}
    if head.get("base"):
        base.update(_preset_overrides(str(head["base"]), path.parent, f"{where} [suite] base"))
    base.update(_overrides_table(head.get("overrides", {}), f"{where} [suite] overrides"))

    cells, seen, folders = [], set(), {}
    raw_cells = data.get("cell", [])
    if not isinstance(raw_cells, list) or not raw_cells:
        raise ConfigError(f"{where}: needs at least one [[cell]]")
    for i, raw in enumerate(raw_cells, 1):
        cw = f"{where} cell {i}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{cw}: each cell must be a [[cell]] table; got {raw!r}")
        _check_keys(raw, CELL_KEYS, cw)
        if not isinstance(raw.get("row"), str) or not isinstance(raw.get("column"), str):
            raise ConfigError(f"{cw}: 'row' and 'column' (strings) are required")
        cw = f"{where} cell {raw['row']!r}/{raw['column']!r}"
        if (raw["row"], raw["column"]) in seen:
            raise ConfigError(f"{cw}: defined twice")
        seen.add((raw["row"], raw["column"]))
        shared = dict(base)
        if raw.get("preset"):
            shared.update(_preset_overrides(str(raw["preset"]), path.parent, cw))
        # the shared keys a cell does not read are dropped (upcycled-theta on vanilla rows); its own are refused
        overrides = drop_unread(shared, _overrides_table(raw.get("overrides", {}), f"{cw} overrides"))
        for key in RUN_KEYS[:3]:
            overrides.pop(key, None)  # the suite sets these per run
        cell = Cell(row=raw["row"], column=raw["column"], overrides=overrides,
                    seeds=_seeds(raw["seeds"], cw) if "seeds" in raw else seeds,
                    paper=_number(raw.get("paper"), f"{cw} paper"),
                    paper_std=_number(raw.get("paper-std"), f"{cw} paper-std"), note=str(raw.get("note", "")))
        try:
            config = validate(cell.run_overrides(cell.seeds[0], Path("/")))
        except ConfigError as err:
            raise ConfigError(f"{cw}: {err}") from None
        if config["checkpoint"]:  # its runs are named s<seed> in every cell: checkpoints and ledgers would mix
            raise ConfigError(f"{cw}: checkpoint = true is for single runs (`privfed run`); a suite redoes an "
                              "unfinished run from its start")
        if cell.folder in folders:
            raise ConfigError(f"{cw}: its folder name {cell.folder!r} clashes with cell {folders[cell.folder]}")
        folders[cell.folder] = cell.label
        cells.append(cell)

    def order(key: str, attr: str) -> tuple[str, ...]:
        found = list(dict.fromkeys(getattr(c, attr) for c in cells))
        given = head.get(key)
        if given is None:
            return tuple(found)
        missing = [x for x in found if x not in given]
        if missing:
            raise ConfigError(f"{where} [suite] {key}: {missing[0]!r} is used by a cell but not listed")
        return tuple(given)

    return Suite(name=str(head.get("name", path.parent.name)), description=str(head.get("description", "")),
                 seeds=seeds, cells=tuple(cells), rows=order("rows", "row"), columns=order("columns", "column"),
                 metric=metric, metric_param=param, scale=scale, source=str(head.get("source", "")),
                 path=str(path))


# --- runs on disk --------------------------------------------------------------
def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in RUN_KEYS}


def expected_config(cell: Cell, seed: int) -> dict[str, Any]:
    return dict(validate(cell.run_overrides(seed, Path("/"))))


def run_is_finished(run_dir: Path, cell: Cell, seed: int) -> bool:
    """summary.json exists and was written for this cell's config (not a stale one)."""
    return finished_as(run_dir, expected_config(cell, seed))


def finished_as(run_dir: Path, wanted: Mapping[str, Any]) -> bool:
    """summary.json exists and was written for the config `wanted` (not a stale one)."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return False
    try:
        config = json.loads(path.read_text()).get("config", {})
    except (OSError, json.JSONDecodeError):
        return False
    return _same_run(_comparable(config), _comparable(dict(wanted))) and config.get("seed") == wanted["seed"]


def _same_run(done: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """A key the finished run's config lacks was added to the schema later: the run only is stale if
    the cell now wants something else than what the run did then (`_did_before_key`)."""
    return all(done[k] == v if k in done else _did_before_key(k, v, done) for k, v in wanted.items()
               if not is_inert(k, wanted))


def _did_before_key(key: str, value: Any, done: dict[str, Any]) -> bool:
    """Whether a run from before `key` existed did what `key = value` does now: the key's default,
    except dp-noise-seed: private runs drew their noise from the run seed, other runs draw none."""
    from common.privacy.plan import is_private

    if key not in SCHEMA:
        return False
    if key == "dp-noise-seed":
        return value == "run-seed" or not is_private({**defaults(), **done})
    return value == SCHEMA[key].default


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class CellResult:
    cell: Cell
    scale: float = 1.0
    values: list[float] = field(default_factory=list)  # scaled metric per finished seed
    seeds: list[int] = field(default_factory=list)
    curves: list[list[float]] = field(default_factory=list)  # scaled accuracy per round, per seed
    run_seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    epsilon_notes: list[str] = field(default_factory=list)  # what the runs' epsilons state (epsilon_note)

    @property
    def n(self) -> int:
        """The seeds in the mean: a diverged run's non-finite value is left out of it."""
        return sum(1 for v in self.values if math.isfinite(v))

    @property
    def mean(self) -> float | None:
        vals = [v for v in self.values if math.isfinite(v)]
        return float(np.mean(vals)) if vals else None

    @property
    def std(self) -> float | None:
        vals = [v for v in self.values if math.isfinite(v)]
        return float(np.std(vals)) if vals else None

    @property
    def diff(self) -> float | None:
        return None if self.mean is None or self.cell.paper is None else mean_difference(self.mean, self.cell.paper)


def mean_difference(a: float, b: float) -> float:
    """a - b for two means over seeds, rounded to 1e-9: equal totals of correct predictions can differ by
    float summation error (~1e-14), while one test sample is 100/n points (0.01 for n = 10,000), so a tie
    reads 0 and a claim "a >= b" holds on it."""
    return round(a - b, 9) + 0.0  # + 0.0: -0.0 prints as "-0.00"


def collect(suite: Suite, suite_dir: Path) -> list[CellResult]:
    """Every cell's finished runs under `suite_dir` (a folder of one of the cell's seeds whose config is
    the cell's: a seed dropped from the suite leaves the mean, with a note; a `--seeds N` check keeps the others)."""
    metric = METRICS[suite.metric]
    out = []
    for cell in suite.cells:
        res = CellResult(cell, suite.scale)
        folder = Path(suite_dir) / cell.folder
        seed_dirs = sorted(folder.glob("s*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1)
        for run_dir in seed_dirs:
            if not run_dir.name[1:].isdigit():
                continue
            seed = int(run_dir.name[1:])
            if seed not in cell.seeds:  # dropped from the suite, or made by an earlier `privfed repro --seeds N`
                if (run_dir / "summary.json").is_file():
                    res.notes.append(f"seed {seed}: a finished run, but not one of the suite's seeds now "
                                     f"({', '.join(map(str, cell.seeds))}); not counted")
                continue
            if not run_is_finished(run_dir, cell, seed):
                if (run_dir / "summary.json").is_file():  # the cell was edited since: `privfed repro` redoes it
                    res.notes.append(f"seed {seed}: its run was made with another config (stale); not counted")
                continue
            try:
                rows = read_rows(run_dir)
            except (OSError, ValueError) as err:  # cut mid-line (a copy, a full disk): not a finished run
                res.notes.append(f"seed {seed}: unreadable metrics.jsonl ({err}); not counted")
                continue
            summary = json.loads((run_dir / "summary.json").read_text())
            if "rounds" in summary and (not rows or rows[-1].get("round") != summary["rounds"]):  # cut at a line
                res.notes.append(f"seed {seed}: metrics.jsonl ends before round {summary.get('rounds')} of its "
                                 "summary.json; not counted")
                continue
            if summary.get("failed_replies"):  # counted, and said: not quite the planned experiment
                res.notes.append(f"seed {seed}: {summary['failed_replies']} train replies failed, timed out or were "
                                 "dropped as unusable")
            if diverged := summary.get("diverged"):
                res.notes.append(f"seed {seed}: the global model diverged in round {diverged['round']} "
                                 f"({diverged['why']}); the run ended there")
            elif summary.get("rounds", 0) < summary.get("planned_rounds", 0):  # its final model is an earlier one
                res.notes.append(f"seed {seed}: ended after round {summary['rounds']} of {summary['planned_rounds']} "
                                 "(no client could train further: budgets spent, or clients left out)")
            value, note = metric.fn(rows, summary, suite.metric_param)
            value = math.nan if summary.get("diverged") else value  # left out of the mean, and noted
            res.values.append(value * suite.scale)
            res.seeds.append(seed)
            res.curves.append([r["accuracy"] * suite.scale if is_measured(r) else math.nan for r in rows])
            res.run_seconds.append(float(summary.get("wall_seconds") or 0.0))
            if note and note not in res.notes:
                res.notes.append(note)
            eps_note = epsilon_note(summary)
            if eps_note and eps_note not in res.epsilon_notes:
                res.epsilon_notes.append(eps_note)
        out.append(res)
    return out


def results_by_cell(suite: Suite, out_dir: Path) -> dict[tuple[str, str], CellResult]:
    """(row, column) -> the cell's finished runs under `out_dir`/<suite name> (privfed repro --out)."""
    return {(r.cell.row, r.cell.column): r for r in collect(suite, Path(out_dir) / suite.name)}


# --- rendering -----------------------------------------------------------------
def _fmt(value: float | None, digits: int) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _digits(suite: Suite) -> int:
    return 2 if abs(suite.scale) >= 10 else 4


def write_csv(suite: Suite, results: list[CellResult], path: Path) -> Path:
    d = _digits(suite) + 2
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for r in results:
            w.writerow([suite.name, r.cell.row, r.cell.column, _fmt(r.mean, d), _fmt(r.std, d), r.n,
                        _fmt(r.cell.paper, d), _fmt(r.diff, d)])
    return path


def _table(suite: Suite, results: list[CellResult], cell_text: Callable[[CellResult], str]) -> list[str]:
    by = {(r.cell.row, r.cell.column): r for r in results}
    lines = ["| | " + " | ".join(suite.columns) + " |", "|---" * (len(suite.columns) + 1) + "|"]
    for row in suite.rows:
        cells = [cell_text(by[(row, col)]) if (row, col) in by else "" for col in suite.columns]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(suite: Suite, results: list[CellResult], plots: list[Path], suite_dir: Path,
                    timing: list[Mapping[str, Any]]) -> str:
    d = _digits(suite)
    metric = METRICS[suite.metric]
    what = metric.doc.replace("metric-param", f"{suite.metric_param:g}" if suite.metric_param is not None else "?")

    def ours(r: CellResult) -> str:
        if r.mean is None:
            text = "—"
        else:
            text = f"{r.mean:.{d}f} ± {r.std:.{d}f}"
        if r.cell.paper is not None:
            paper = f"{r.cell.paper:.{d}f}" + (f" ± {r.cell.paper_std:.{d}f}" if r.cell.paper_std is not None else "")
            text += f" ({paper})"
        return text + partial(r)

    def diff(r: CellResult) -> str:
        return ("—" if r.diff is None else f"{r.diff:+.{d}f}") + partial(r)

    def partial(r: CellResult) -> str:  # a mean over fewer seeds than planned says so in every table
        return f" [n={r.n}]" if r.n and r.n != len(r.cell.seeds) else ""

    finished = sum(len(r.values) for r in results)
    planned = sum(len(r.cell.seeds) for r in results)
    lines = [f"# Reproduction: {suite.name}", ""]
    if suite.description:
        lines += [suite.description, ""]
    lines += [
        f"- metric: {what}" + (f", × {suite.scale:g}" if suite.scale != 1 else ""),
        f"- paper numbers: {suite.source or 'see suite file'}; suite file: `{suite.path}`",
        f"- seeds: {', '.join(map(str, suite.seeds))}; finished runs: {finished} of {planned} planned",
        f"- aggregation: mean ± population std (ddof = 0) over finished seeds",
    ]
    if suite.metric == "accuracy-at-epsilon":  # the metric reads the runs' epsilons: say what they state
        lines += _epsilon_notes(results)
    run_total = sum(sum(r.run_seconds) for r in results)
    if timing:
        last, total = timing[-1], sum(t["wall_seconds"] for t in timing)
        executed = sum(t["executed"] for t in timing)
        stopped = sum(1 for t in timing if t.get("interrupted"))
        lines.append(f"- suite wall time: {total:.1f} s over {len(timing)} `privfed repro` invocation(s) "
                     f"({executed} runs executed in all{f'; {stopped} interrupted' if stopped else ''}); "
                     f"the last took {last['wall_seconds']:.1f} s{' (interrupted)' if last.get('interrupted') else ''}: "
                     f"{last['executed']} runs executed, {last['skipped']} skipped, {last['failed']} failed, "
                     f"{last['jobs']} job(s)")
    lines.append(f"- sum of the finished runs' own wall times: {run_total:.1f} s")
    lines += ["", "## Ours vs paper", "",
              "Each cell: ours mean ± std (paper" + (" ± std" if any(r.cell.paper_std is not None for r in results) else "")
              + "); `—`: no finished run.", ""]
    lines += _table(suite, results, ours)
    lines += ["", "## Difference (ours − paper)", ""]
    lines += _table(suite, results, diff)
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}]({p.relative_to(suite_dir).as_posix()})" for p in plots]
    notes = [f"- {r.cell.label}: {n}" for r in results for n in ([r.cell.note] if r.cell.note else []) + r.notes]
    if notes:
        lines += ["", "## Notes", ""] + notes
    return "\n".join(lines) + "\n"


def _epsilon_notes(results: list[CellResult]) -> list[str]:
    """Each distinct epsilon statement once, naming its cells unless every cell with runs makes it."""
    cells: dict[str, list[str]] = {}
    for r in results:
        for note in r.epsilon_notes:
            cells.setdefault(note, []).append(r.cell.label)
    with_runs = sum(1 for r in results if r.epsilon_notes)
    return [f"- {note}" + ("" if len(labels) == with_runs else f" ({', '.join(labels)})")
            for note, labels in cells.items()]


def plot_curves(suite: Suite, results: list[CellResult], out_dir: Path) -> list[Path]:
    """Per column: test accuracy per round, mean over seeds (band: ± std), one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for col in suite.columns:
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = False
        for r in results:
            if r.cell.column != col or not r.curves:
                continue
            length = min(len(c) for c in r.curves)
            if length == 0:
                continue
            arr = np.array([c[:length] for c in r.curves], dtype=float)
            measured = ~np.all(np.isnan(arr), axis=0)  # eval-every > 1: only the evaluated rounds
            arr, x = arr[:, measured], np.arange(1, length + 1)[measured]
            mean, std = np.nanmean(arr, axis=0), np.nanstd(arr, axis=0)
            cut = f", cut at round {length}: its shortest seed" if any(len(c) > length for c in r.curves) else ""
            ax.plot(x, mean, label=f"{r.cell.row} (n={len(r.curves)}{cut})", marker="." if len(x) < 40 else None)
            ax.fill_between(x, mean - std, mean + std, alpha=0.2)
            drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy" + (f" × {suite.scale:g}" if suite.scale != 1 else ""))
        ax.set_title(f"{suite.name}: {col}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"curves_{slug(col)}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_vs_paper(suite: Suite, results: list[CellResult], out_dir: Path) -> Path | None:
    """Ours (mean ± std) against the paper's number, one point per cell, with the y = x line."""
    pts = [r for r in results if r.mean is not None and r.cell.paper is not None]
    if not pts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    markers = "osD^v<>pPX*h"
    for i, col in enumerate(suite.columns):
        sel = [r for r in pts if r.cell.column == col]
        if not sel:
            continue
        ax.errorbar([r.cell.paper for r in sel], [r.mean for r in sel], yerr=[r.std for r in sel],
                    xerr=[r.cell.paper_std or 0.0 for r in sel], fmt=markers[i % len(markers)], label=col,
                    capsize=3)
        for r in sel:
            ax.annotate(r.cell.row, (r.cell.paper, r.mean), fontsize=7, xytext=(3, 3), textcoords="offset points")
    lo = min(min(r.cell.paper, r.mean) for r in pts)
    hi = max(max(r.cell.paper, r.mean) for r in pts)
    pad = 0.05 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=0.8, label="ours = paper")
    ax.set_xlabel("paper")
    ax.set_ylabel("ours (mean ± std over seeds)")
    ax.set_title(f"{suite.name}: ours vs paper")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "ours_vs_paper.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_snapshot(suite: Suite, suite_dir: Path) -> Path:
    suite_dir.mkdir(parents=True, exist_ok=True)
    path = suite_dir / SNAPSHOT_FILE
    text = json.dumps(suite.to_json(), indent=2) + "\n"
    write_atomically(path, lambda fh: fh.write(text.encode()))  # a full disk keeps the earlier snapshot
    return path


def read_snapshot(suite_dir: Path) -> Suite:
    return Suite.from_json(json.loads((Path(suite_dir) / SNAPSHOT_FILE).read_text()))


def write_timing(suite_dir: Path, wall_seconds: float, executed: int, skipped: int, failed: int, jobs: int,
                 interrupted: bool = False) -> Path:
    """Append this invocation's timing to timing.json (the report shows the last one and the total)."""
    path = Path(suite_dir) / TIMING_FILE
    history = read_timing(suite_dir)
    history.append({"wall_seconds": wall_seconds, "executed": executed, "skipped": skipped, "failed": failed,
                    "jobs": jobs, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    **({"interrupted": True} if interrupted else {})})
    text = json.dumps({"invocations": history}, indent=2) + "\n"
    write_atomically(path, lambda fh: fh.write(text.encode()))  # a full disk keeps the earlier history
    return path


def read_timing(suite_dir: Path) -> list[dict[str, Any]]:
    path = Path(suite_dir) / TIMING_FILE
    try:
        return list(json.loads(path.read_text())["invocations"])
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return []


def render_report(suite_dir: Path, suite: Suite | None = None, plots: bool = True) -> tuple[Path, list[CellResult]]:
    """Write report.md, report.csv and plots/ for the suite results under `suite_dir`."""
    suite_dir = Path(suite_dir)
    suite = suite or read_snapshot(suite_dir)
    results = collect(suite, suite_dir)
    plot_paths: list[Path] = []
    if plots:
        plot_dir = suite_dir / "plots"
        plot_dir.mkdir(exist_ok=True)
        vs = plot_vs_paper(suite, results, plot_dir)
        plot_paths = ([vs] if vs else []) + plot_curves(suite, results, plot_dir)
    timing = read_timing(suite_dir)
    write_csv(suite, results, suite_dir / "report.csv")
    md = suite_dir / "report.md"
    md.write_text(render_markdown(suite, results, plot_paths, suite_dir, timing))
    return md, results
