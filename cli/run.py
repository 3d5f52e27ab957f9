"""`privfed run`: run one preset (optionally once per seed) and print a summary.

    privfed run PRESET [--set key=value ...] [--engine inprocess|simulation] [--seeds 1,2,3]
                       [--workers N] [--threads N] [--timeout S] [--gpus-per-client G]
                       [--results-dir DIR] [--quiet]

PRESET is a preset name (`presets/NAME.toml`, e.g. `default` or
`fedavg-syn-iid`) or a path to a TOML file of run-config overrides. `--set`
values are TOML scalars (`--set lr=0.05 --set synthetic-iid=true --set
run-name="x"`); a bare word that is not valid TOML is taken as a string
(`--set dataset=mnist`).

Engines: `inprocess` (default) runs the Flower ClientApp and the server runner
in this process over privfed's in-process grid: fast single-machine
experiments. `simulation` goes through `flwr run` (Flower's simulation
engine: Ray actors, GPU resources) with a private FLWR_HOME, and stops every
process it started.

Results never overwrite earlier ones: a run-name whose results folder already
holds a run is refused (unless `checkpoint = true`, which resumes it), and a
default name that is taken gets a suffix (`-2`, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Mapping

from common.number_checks import is_real

APP_DIR = Path(__file__).resolve().parents[1]
PRESETS_DIR = APP_DIR / "presets"
REPRO_DIR = PRESETS_DIR / "repro"
ENGINES = ("inprocess", "simulation")


# --- presets and overrides -------------------------------------------------------
def available_presets() -> list[str]:
    """Preset names under presets/ (sub-folders as 'folder/name'), excluding repro suites."""
    if not PRESETS_DIR.is_dir():
        return []
    names = []
    for path in sorted(PRESETS_DIR.rglob("*.toml")):
        rel = path.relative_to(PRESETS_DIR)
        if rel.parts[0] == "repro":
            continue
        names.append(rel.with_suffix("").as_posix())
    return names


def resolve_preset(preset: str, base_dir: Path | None = None) -> Path:
    """A preset name or path -> the TOML file; ConfigError listing the presets if not found."""
    from common.config import ConfigError

    candidates = [Path(preset).expanduser()]
    if base_dir is not None:
        candidates.insert(0, base_dir / preset)
    name = preset[:-5] if preset.endswith(".toml") else preset
    candidates.append(PRESETS_DIR / f"{name}.toml")
    for path in candidates:
        if path.is_file():
            return path.resolve()
    import difflib

    names = available_presets()
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(f"unknown preset {preset!r} (no such file, and no presets/{name}.toml).{hint} "
                      f"Available presets: {', '.join(names) or '(none)'}; or give a path to a TOML file")


def parse_scalar(text: str) -> Any:
    """A TOML scalar (`0.05`, `true`, `"x"`, `1`); a bare word that is not TOML stays a string."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(value, (dict, list)):
        from common.config import ConfigError

        raise ConfigError(f"--set values must be scalars (number, boolean or string); got {text!r}")
    return value


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    from common.config import ConfigError

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = parse_scalar(value.strip())
    return out


def parse_seeds(text: str | None) -> list[int] | None:
    from common.config import ConfigError

    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        raise ConfigError(f"--seeds expects comma-separated integers such as 1,2,3; got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds expects distinct non-negative integers such as 1,2,3; got {text!r}")
    return seeds


def build_overrides(preset: str, sets: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Preset overrides with --set applied on top, validated (ConfigError names a bad key), and the preset's
    keys that the --set values make unread (its upcycled-theta with `upcycled=false`), which are dropped."""
    from common.config import drop_unread, load_preset, validate

    base = load_preset(resolve_preset(preset))
    overrides = drop_unread(base, sets)
    validate(overrides)
    return overrides, sorted(set(base) - set(overrides))


def absolute_paths(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every path key made absolute in this process (Flower's processes have another cwd)."""
    from common.config import resolve_data_dir, validate

    config = validate(overrides)
    out = dict(overrides)
    out["data-dir"] = str(resolve_data_dir(config))
    for key in ("results-dir", "state-dir", "checkpoint-dir"):  # state and checkpoints: "" is a default
        if config[key]:
            out[key] = str(Path(str(config[key])).expanduser().resolve())
    return out


def preflight_data(config) -> None:
    """Load the federation and test set now, so a missing file is one clear error before any run; and
    check that the nodes' state directory can be one (else every client fails every round)."""
    from client.privacy import state_dir
    from common.config import ConfigError
    from common.data import load_federation, load_test_set

    try:
        load_federation(config)
        load_test_set(config)
    except MemoryError:
        raise ConfigError(f"dataset {config['dataset']!r} with this config does not fit in memory") from None
    folder = state_dir(config, {})
    blocked = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocked is not None and not blocked.is_dir():
        raise ConfigError(f"state-dir {folder} cannot be a folder: {blocked} is a file")


def claim_results(runs: list[dict[str, Any]], config, per_seed: bool) -> list[dict[str, Any]]:
    """`runs` with results folders of their own: an earlier run's results are never overwritten.
    `per_seed`: runs of --seeds, named <name>-s<seed>."""
    from server.results import claim_run_names, default_run_name, refuse_taken

    if config["checkpoint"]:  # the same run-name resumes that run (the runner refuses an empty one)
        return runs
    root = Path(str(config["results-dir"])).expanduser().resolve()
    if config["run-name"]:
        for run in runs:
            refuse_taken(root / str(run["run-name"]))
        return runs
    suffixes = [f"-s{run['seed']}" for run in runs] if per_seed else [""]
    base = claim_run_names(root, default_run_name(config), suffixes)
    return [{**run, "run-name": base + suffix} for run, suffix in zip(runs, suffixes)]


# --- one run -------------------------------------------------------------------
class SimulationFailed(RuntimeError):
    """`flwr run` exited with an error (the message holds the tail of its output)."""


# a traceback's last line, in flwr's output: the ServerApp refused the config, or to resume its checkpoint
REFUSAL_LINE = re.compile(r"(ConfigError|CheckpointError|DataFileMissing|DataFileCorrupt): (.+)$", re.M)


def run_one(overrides: Mapping[str, Any], *, engine: str, workers: int = 1, threads: int | None = 1,
            console=None, quiet: bool = False, timeout: float = 24 * 3600, gpus_per_client: float = 0.0) -> Path:
    """Run validated `overrides` on `engine`; return the results folder (RuntimeError on failure).
    `quiet`: no per-round lines and no Flower output; the run's own notes and warnings still print."""
    from common.checkpoint_file import CheckpointError
    from common.config import ConfigError, validate
    from common.data.errors import DataFileError

    absolute = absolute_paths(overrides)  # both engines: a checkpoint resumes on either
    config = validate(absolute)
    if engine == "inprocess":
        from server.inprocess import run_inprocess

        return run_inprocess(config, workers=workers, console=console, threads=threads, round_lines=not quiet)
    if engine == "simulation":
        from server.flower_run import TIMED_OUT, run_with_flower

        def echo(line: str) -> None:  # flwr's output as is; quiet: only the run's own lines
            if not quiet or "privfed: " in line:
                print(line, flush=True)

        code, output, results = run_with_flower(absolute, int(config["num-clients"]),
                                                timeout=timeout, echo=echo, gpus_per_client=gpus_per_client)
        if code != 0 or results is None:
            if refusal := REFUSAL_LINE.findall(output):  # the ServerApp refused the run (Flower exits 0)
                kind, why = refusal[-1]
                raise {"ConfigError": ConfigError, "CheckpointError": CheckpointError}.get(kind, DataFileError)(
                    why.strip())
            tail = "\n".join(output.rstrip().splitlines()[-15:])
            why = (f"timed out after {timeout:g} s (--timeout)" if TIMED_OUT in output
                   else f"failed (exit code {code})" if code else "failed: the ServerApp ended without results")
            raise SimulationFailed(f"flwr run {why}; last output:\n{tail}")
        return results
    raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")


def read_summary(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    rows_path = Path(run_dir) / "metrics.jsonl"
    last = {}
    if rows_path.is_file():
        lines = [line for line in rows_path.read_text().splitlines() if line.strip()]
        last = json.loads(lines[-1]) if lines else {}
    from server.report import epsilon_note, row_epsilon

    final = summary.get("final", {})
    epsilon = row_epsilon(final)
    if epsilon is None:
        epsilon = row_epsilon(last)
    numbers = {"accuracy": final.get("accuracy"), "loss": final.get("loss"), "epsilon": epsilon,
               "rounds": summary.get("rounds"), "wall": summary.get("wall_seconds")}
    for name, value in numbers.items():  # a damaged file: refused here, not a traceback where a row prints
        if value is not None and (not is_real(value)):
            raise ValueError(f"its {name} is {value!r}, not a number")
    return {**numbers, "seed": summary.get("config", {}).get("seed"), "path": str(run_dir),
            "epsilon_note": epsilon_note(summary)}


def print_epsilon_notes(console, results: list[dict[str, Any]]) -> None:
    """What the epsilons state: once if every private run states the same, else each with the runs it is about."""
    runs_of: dict[str, list[str]] = {}
    for r in results:
        if r.get("epsilon_note"):
            runs_of.setdefault(r["epsilon_note"], []).append(r["path"])  # as the table names the run
    for note, runs in runs_of.items():
        about = f"{', '.join(runs)}: " if len(runs_of) > 1 else ""
        console.print(f"{about}{note}", markup=False, highlight=False, soft_wrap=True)


def _fmt(value: Any, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def print_summary(console, results: list[dict[str, Any]], engine: str) -> None:
    from rich.table import Table

    table = Table(title=f"privfed run ({engine})", title_justify="left")
    for col in ("seed", "accuracy", "loss", "epsilon", "rounds", "seconds"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(str(r["seed"]), _fmt(r["accuracy"]), _fmt(r["loss"]), _fmt(r["epsilon"], ".3f"),
                      str(r["rounds"]), _fmt(r["wall"], ".1f"))
    if len(results) > 1:
        import numpy as np

        def ms(key):
            vals = [r[key] for r in results if r[key] is not None]
            return f"{np.mean(vals):.4f} ± {np.std(vals):.4f}" if vals else "-"

        table.add_row("mean ± std", ms("accuracy"), ms("loss"), ms("epsilon"), "", "")
    console.print(table)
    print_epsilon_notes(console, results)


# --- command -------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run a preset (in-process or through Flower's simulation)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", help="preset name (presets/NAME.toml) or path to a TOML file")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help="override one run-config key (TOML scalar); repeatable")
    p.add_argument("--engine", choices=ENGINES, default="inprocess",
                   help="inprocess (default: fast, one process) or simulation (flwr run)")
    p.add_argument("--seeds", help="comma-separated seeds: one run per seed, run-name suffixed -s<seed>")
    p.add_argument("--workers", type=int,
                   help="in-process engine: client worker processes (default 1: clients run one after another)")
    p.add_argument("--threads", type=int,
                   help="in-process engine: torch threads in this process (default 1; 0: leave torch's default)")
    p.add_argument("--results-dir", help="shorthand for --set results-dir=DIR")
    p.add_argument("--timeout", type=float,
                   help="simulation engine: seconds before giving up (default 86400)")
    p.add_argument("--gpus-per-client", type=float,
                   help="simulation engine: GPUs each client's Ray actor holds (default 0: Ray hides the GPU from "
                        "it; 0.25 puts four clients on one GPU)")
    p.add_argument("--quiet", action="store_true",
                   help="no per-round lines and no Flower output: the run's notes and warnings, then the summary")
    p.set_defaults(func=main)


ENGINE_OPTIONS = {"inprocess": {"workers": 1, "threads": 1},
                  "simulation": {"timeout": 24 * 3600.0, "gpus_per_client": 0.0}}


def engine_options(args: argparse.Namespace) -> None:
    """Fill in the chosen engine's options; ConfigError for an option of the other engine, which it would
    silently ignore."""
    from common.config import ConfigError

    for engine, options in ENGINE_OPTIONS.items():
        for name, default in options.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
            elif engine != args.engine:
                raise ConfigError(f"--{name.replace('_', '-')} applies to --engine {engine} only "
                                  f"(this run: --engine {args.engine})")


def error(command: str, err: BaseException | str, code: int = 2) -> int:
    """Print `privfed COMMAND: error: ...` (no traceback) and return the exit code."""
    print(f"privfed {command}: error: {str(err).strip()}", file=sys.stderr)
    return code


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from common.checkpoint_file import CheckpointError
    from common.config import ConfigError, validate
    from common.data.errors import DataFileError

    console = Console(highlight=False)
    try:
        sets = parse_sets(args.sets)
        if args.results_dir:
            sets["results-dir"] = args.results_dir
        overrides, dropped = build_overrides(args.preset, sets)
        if dropped:
            console.print(f"privfed run: dropped the preset's {', '.join(dropped)}, which this run does not read",
                          markup=False)
        seeds = parse_seeds(args.seeds)
        engine_options(args)
        if args.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {args.workers}")
        if args.threads < 0:
            raise ConfigError(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
        if not args.timeout > 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {args.timeout}")
        if not 0 <= args.gpus_per_client <= 1024:
            raise ConfigError(f"--gpus-per-client must be in [0, 1024], got {args.gpus_per_client}")
        config = validate(overrides)
        if args.engine == "simulation" and config["device"] == "cuda" and not args.gpus_per_client:
            raise ConfigError("device = 'cuda' on the simulation engine needs --gpus-per-client > 0: Ray hides "
                              "the GPU from a client actor that holds none")
        if seeds:
            base = str(config["run-name"])  # empty: claim_results names the runs
            runs = [{**overrides, "seed": s, **({"run-name": f"{base}-s{s}"} if base else {})} for s in seeds]
        else:
            runs = [overrides]
        for run in runs:
            validate(run)
        preflight_data(validate(runs[0]))
        runs = claim_results(runs, config, bool(seeds))
    except (ConfigError, DataFileError) as err:
        return error("run", err)

    run_console = Console(highlight=False)
    threads = None if args.threads == 0 else args.threads
    results, started = [], time.perf_counter()
    for i, run in enumerate(runs, 1):
        if len(runs) > 1:
            console.print(f"[bold]privfed run: {i}/{len(runs)}[/] seed {run['seed']}")
        try:
            run_dir = run_one(run, engine=args.engine, workers=args.workers, threads=threads,
                              console=run_console, quiet=args.quiet, timeout=args.timeout,
                              gpus_per_client=args.gpus_per_client)
        except (ConfigError, DataFileError, CheckpointError) as err:  # the user's to fix: exit 2, all of it
            return error("run", err)
        except SimulationFailed as err:
            return error("run", err, 1)
        except Exception as err:  # noqa: BLE001 (one line for the user, not a traceback)
            if os.environ.get("PRIVFED_DEBUG"):
                raise
            first = (str(err).strip().splitlines() or [""])[0]
            return error("run", f"{type(err).__name__}: {first} (PRIVFED_DEBUG=1 shows the traceback)", 1)
        results.append(read_summary(run_dir))
    print_summary(console, results, args.engine)
    console.print(f"privfed: {len(results)} run(s) in {time.perf_counter() - started:.1f} s")
    for r in results:
        console.print(f"privfed: results in {r['path']}", markup=False, soft_wrap=True)
    return 0
