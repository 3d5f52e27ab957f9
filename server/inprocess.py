"""The in-process engine: the same runner and ClientApp as under Flower, over
`InProcessGrid`. For fast single-machine experiments."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from common.config import RunConfig
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation

CLIENT_APP = "client.app:app"


def run_inprocess(config: RunConfig, *, workers: int = 1, console: Console | None = None) -> Path:
    with InProcessGrid(CLIENT_APP, dict(config), int(config["num-clients"]), workers=workers) as grid:
        return run_federation(grid, config, console)
