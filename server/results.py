"""Per-round metrics, the run summary and plots, under results/<run-name>/."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import math
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from common.config import ConfigError
from common.durable import write_atomically

PACKAGES = ("privfed", "flwr", "torch", "numpy", "opacus", "dp-accounting", "cryptography")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def default_run_name(config: Mapping[str, Any]) -> str:
    return f"{config['strategy']}-{config['dataset']}-{time.strftime('%Y%m%d-%H%M%S')}"


def claim_run_names(root: Path, stem: str, suffixes: list[str]) -> str:
    """The first base of stem, stem-2, stem-3, ... for which every folder root/<base><suffix> can be made
    now, made: a default name is a timestamp, which runs started in the same second share."""
    for base in itertools.chain([stem], (f"{stem}-{i}" for i in itertools.count(2))):
        if _claim([root / f"{base}{suffix}" for suffix in suffixes]):
            return base
    raise AssertionError("unreachable: the name candidates never end")


def _claim(folders: list[Path]) -> bool:
    made = []
    try:
        for folder in folders:
            folder.mkdir(parents=True)  # no exist_ok: atomic against a concurrent run
            made.append(folder)
    except FileExistsError:
        for folder in made:
            folder.rmdir()
        return False
    except OSError as err:
        raise ConfigError(f"cannot create results folder {folder}: {err.strerror or err}") from None
    return True


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run's results, finished or not: a fresh run must not overwrite them (an
    empty metrics.jsonl: a run that died in its first round, which left nothing to lose)."""
    metrics = run_dir / "metrics.jsonl"
    return (run_dir / "summary.json").exists() or (metrics.exists() and metrics.stat().st_size > 0)


def refuse_taken(run_dir: Path) -> None:
    """ConfigError if `run_dir` holds a run (`privfed run` checks every run up front, the ServerApp again)."""
    if holds_run(run_dir):
        raise ConfigError(f"results folder {run_dir} already holds a run; choose another run-name or remove "
                          "that folder")


class RunFolderInUse(ConfigError):
    """Another run (another command, or this one) holds the results folder."""


_held: set[Path] = set()


@contextlib.contextmanager
def hold_run_folder(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir` while a run writes it: another run (or a resume) of the same folder meanwhile is a
    ConfigError, not a second writer of its files. An flock on `.running`: it ends with the process,
    however the process ends, so a crashed run leaves no stale claim."""
    run_dir = run_dir.resolve()
    if run_dir in _held:  # this process holds it already (repro's job, then the run inside it)
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".running", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUse(f"results folder {run_dir} is in use by a run still going; choose another "
                                 "run-name") from None
        except OSError as err:  # a filesystem without flock (some network mounts): run unheld, as before
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        _held.add(run_dir)
        try:
            yield
        finally:
            _held.discard(run_dir)


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class ResultsWriter:
    def __init__(self, results_dir: str | Path, run_name: str):
        """An earlier run's metrics.jsonl stays on disk until `reset`: a resume must not lose its rows
        before its checkpoint has been read."""
        self.run_dir = Path(results_dir).expanduser().resolve() / run_name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.rows: list[dict[str, Any]] = []

    def reset(self, rows: list[Mapping[str, Any]] = ()) -> None:
        """Start metrics.jsonl over, with `rows` (a resumed run's rows so far)."""
        self.rows = []
        self.metrics_path.write_text("")
        for row in rows:
            self.add_round(row)

    def add_round(self, row: Mapping[str, Any]) -> None:
        row = _clean(dict(row))
        self.rows.append(row)
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """summary.json, written whole or not at all: its presence marks a finished run."""
        path = self.run_dir / "summary.json"
        text = json.dumps(_clean(dict(summary)), indent=2, sort_keys=True) + "\n"
        write_atomically(path, lambda fh: fh.write(text.encode()))
        return path

    def save_model(self, arrays) -> Path:
        """The final global model as model.npz (one array per state_dict entry)."""
        path = self.run_dir / "model.npz"
        write_atomically(path, lambda fh: np.savez(fh, **{key: array.numpy() for key, array in arrays.items()}))
        return path

    def plot_accuracy(self, title: str) -> Path:
        return plot_accuracy(self.rows, self.run_dir / "accuracy.png", title)

    def plot_accuracy_vs_epsilon(self, title: str) -> Path:
        return plot_accuracy_vs_epsilon(self.rows, self.run_dir / "accuracy_vs_epsilon.png", title)


def read_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _plot(xs: list, ys: list, xlabel: str, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="." if len(xs) < 40 else None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def is_measured(row: Mapping[str, Any]) -> bool:
    """The row's accuracy was measured at its round: not a copy carried by a round eval-every skipped."""
    return row.get("accuracy") is not None and row.get("evaluated") is not False


def plot_accuracy(rows: list[Mapping[str, Any]], path: Path, title: str) -> Path:
    rows = [r for r in rows if is_measured(r)]
    return _plot([r["round"] for r in rows], [r["accuracy"] for r in rows], "round", path, title)


def plot_accuracy_vs_epsilon(rows: list[Mapping[str, Any]], path: Path, title: str) -> Path:
    label = f"epsilon spent (max over clients, delta = {rows[-1]['delta']}, {rows[-1]['accountant']})"
    rows = [r for r in rows if is_measured(r)]
    return _plot([r["epsilon_max"] for r in rows], [r["accuracy"] for r in rows], label, path, title)
