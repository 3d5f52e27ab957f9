"""Build the strategy named in the run config."""

from __future__ import annotations

from common.config import RunConfig
from server.roster import Roster


def build_strategy(config: RunConfig, roster: Roster, log=print):
    name = config["strategy"]
    if name == "fedavg":
        from server.strategies.fedavg import FedAvg

        return FedAvg(roster, int(config["seed"]), float(config["fraction-train"]), log)
    raise ValueError(f"unknown strategy {name!r}")
