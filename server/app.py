"""The privfed ServerApp: validate the run config, then hand Flower's grid to
the engine-agnostic runner."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from common.config import validate
from server.runner import run_federation

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = validate(context.run_config)  # stops the run before any training on a bad key
    run_federation(grid, config)
