"""Build the strategy named in the run config: the base algorithm, with its
stragglers, wrapped in Upcycled-FL when `upcycled` is true."""

from __future__ import annotations

import logging

from common.config import ConfigError, RunConfig
from server.roster import Roster


class _NoFederatedEvaluationWarning(logging.Filter):
    """privfed evaluates the global model centrally (server/runner.py), so every strategy sets
    fraction_evaluate = 0, and Flower's strategies warn about that each time one is built."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("fraction_evaluate is set to 0.0")


logging.getLogger("flwr").addFilter(_NoFederatedEvaluationWarning())


def note_noise_seed(config: RunConfig, log=print) -> None:
    """Say so when a private run's noise is reproducible from its config (dp-noise-seed = 'run-seed')."""
    from common.privacy.plan import is_private

    if is_private(config) and config["dp-noise-seed"] == "run-seed":
        log("dp-noise-seed = 'run-seed': the DP noise and sampling derive from the run seed (reproducible); "
            "anyone who knows the run config can regenerate them, so DP holds only against parties who do not")


def build_base(config: RunConfig, roster: Roster, log=print):
    name = config["strategy"]
    args = (roster, int(config["seed"]), float(config["fraction-train"]), log)
    if name == "fedavg":
        from server.strategies.fedavg import FedAvg

        return FedAvg(*args)
    if name == "fedavgm":
        from server.strategies.fedavgm import FedAvgM

        return FedAvgM(*args, server_momentum=float(config["server-momentum"]),
                       nesterov=bool(config["server-nesterov"]))
    if name == "fedprox":
        from server.strategies.fedprox import FedProx

        return FedProx(*args, proximal_mu=float(config["prox-mu"]))
    if name == "scaffold":
        from server.strategies.scaffold import Scaffold

        return Scaffold(*args, server_lr=float(config["scaffold-server-lr"]))
    if name == "feddyn":
        from server.strategies.feddyn import FedDyn

        return FedDyn(*args, alpha=float(config["feddyn-alpha"]))
    if name == "pfedme":
        from server.strategies.pfedme import PFedMe

        from common.data import load_federation

        return PFedMe(*args, test_sizes={p: len(c.y_test) for p, c in enumerate(load_federation(config).clients)})
    if name == "fedyogi":
        from server.strategies.fedyogi import FedYogi

        return FedYogi(*args, eta=float(config["yogi-lr"]), tau=float(config["yogi-tau"]),
                       beta_1=float(config["yogi-beta1"]), beta_2=float(config["yogi-beta2"]))
    if name == "dpfedavg-hu":  # DP-FedAvg of Hu et al. (zCDP, secure aggregation)
        from server.strategies.dpfedavg_hu import DpFedAvgHu

        return DpFedAvgHu(*args, config=config)
    if name == "fedlap":  # FedLAP-DP: trains on the clients' synthetic sets
        from server.strategies.fedlap import FedLap

        return FedLap(*args, config=config)
    if name == "ali-dpfl":  # ALI-DPFL: tau* by Eq. 9 from the remaining budget
        from server.strategies.ali_dpfl import AliDpfl

        return AliDpfl(*args, config=config)
    raise ValueError(f"unknown strategy {name!r}")


def build_strategy(config: RunConfig, roster: Roster, log=print):
    note_noise_seed(config, log)
    strategy = build_base(config, roster, log)
    if hasattr(strategy, "setup_stragglers"):
        strategy.setup_stragglers(float(config["stragglers"]), int(config["local-epochs"]))
    elif float(config["stragglers"]) > 0:
        raise ConfigError(f"strategy {config['strategy']!r} does not support stragglers; set stragglers = 0")
    if config["upcycled"]:
        from server.strategies.upcycled import Upcycled, theta_schedule

        theta = theta_schedule(float(config["upcycled-theta"]), float(config["upcycled-mu"]),
                               float(config["upcycled-lambda"]), float(config["upcycled-lambda-growth"]))
        strategy = Upcycled(strategy, theta, log)
    return strategy
