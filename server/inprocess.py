"""The in-process engine: the same runner and ClientApp as under Flower, over
`InProcessGrid`. For fast single-machine experiments.

Engine behaviour (documented in the README, "Engines"):

- torch runs with `threads` intra-op threads (default 1) for the duration of
  the run, and the previous setting is restored afterwards. The models of the
  synthetic/tabular experiments are tiny (hundreds to thousands of weights):
  their steps are dominated by per-op overhead, and extra threads only add
  synchronisation (on a busy 2-core machine 2 threads made a Table-1 run ~10x
  slower than 1). Pass `threads=None` to leave torch's setting alone (e.g.
  CNNs on a many-core machine). With `workers = N` each worker process gets
  the same count, so the numbers do not depend on N.
- Flower's own INFO log lines (one per aggregation) are silenced during the
  run; privfed prints its own per-round progress line.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from rich.console import Console

from common.config import RunConfig
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation

CLIENT_APP = "client.app:app"
DEFAULT_THREADS = 1


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Set torch's intra-op thread count for the block; restore it afterwards."""
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
    try:
        yield
    finally:
        if threads is not None:
            torch.set_num_threads(previous)


@contextlib.contextmanager
def quiet_flower(level: int = logging.WARNING):
    """Raise the `flwr` logger's level for the block; restore it afterwards."""
    import flwr.common.logger  # noqa: F401  (configures the "flwr" logger; import before changing it)

    logger = logging.getLogger("flwr")
    previous = logger.level
    logger.setLevel(max(level, previous))
    try:
        yield
    finally:
        logger.setLevel(previous)


def run_inprocess(config: RunConfig, *, workers: int = 1, console: Console | None = None,
                  threads: int | None = DEFAULT_THREADS, round_lines: bool = True) -> Path:
    """Run `config` on the in-process engine; return the results folder.

    `workers`: 1 runs clients one after another in this process; N > 1 runs
    them in N worker processes. `threads`: torch intra-op threads in this
    process while the run lasts (None: leave as is). `round_lines`: print a
    line per round.
    """
    with torch_threads(threads), quiet_flower(), \
            InProcessGrid(CLIENT_APP, dict(config), int(config["num-clients"]), workers=workers) as grid:
        return run_federation(grid, config, console, round_lines)
