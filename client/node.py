"""What a node knows about itself: its validated run config, its partition,
and its data and model, kept per process across messages.

A node learns who it is from its node config: `partition-id` and
`num-partitions` (filled in by Flower's simulation; passed with
`flower-supernode --node-config` in deployment), plus optional `data-dir`
(beats the run config's, since data lives where the node is) and
`max-epsilon`, the data owner's own cap on its epsilon at the run's
target-delta: the node's budget is the smaller of it and the run's
target-epsilon, and such a node refuses a run without a privacy mechanism
(principle 3: privacy is owned by the data owner, not the experimenter).
"""

from __future__ import annotations

import functools
import math

import torch
from flwr.app import Context

from common.config import ConfigError, RunConfig, resolve_model_name, validate
from common.data import load_client, load_federation
from common.evaluation import pick_device
from common.models import build_model
from common.number_checks import is_real
from common.privacy.plan import delta_too_large, is_private, planned_entries


class NodeSetupError(ValueError):
    """The node config does not fit the run (partition out of range, ...)."""


@functools.lru_cache(maxsize=8)
def _config(items: tuple) -> RunConfig:
    return validate(dict(items))


def owner_cap(node_config) -> float | None:
    """The node config's `max-epsilon` (None if unset); NodeSetupError unless a finite number > 0."""
    cap = node_config.get("max-epsilon")
    if cap is None:
        return None
    if not is_real(cap) or not 0 < cap < math.inf:
        raise NodeSetupError(f"node config max-epsilon must be a finite number > 0, got {cap!r}")
    return float(cap)


def owner_refusal(node_config, config: RunConfig, instruction, dataset_size: int) -> str | None:
    """Why a node whose owner caps its epsilon (`max-epsilon`) refuses this instruction, if it does. The run
    config is the experimenter's, i.e. the server's: a cap holds only for an epsilon that is a guarantee
    against the server. None: no cap, or nothing to refuse (a malformed instruction is the rule's to refuse)."""
    cap = owner_cap(node_config)
    if cap is None:
        return None
    why = None
    if not is_private(config):
        why = "this run releases updates without a privacy mechanism"
    elif delta_too_large(config, dataset_size):
        why = (f"at this run's target-delta = {config['target-delta']:g} (at least 1/|D_i|, {dataset_size} records "
               "here) an epsilon guarantees nothing")
    elif config["dp-noise-seed"] != "secret":
        why = (f"this run's noise is derived from its seed (dp-noise-seed = {config['dp-noise-seed']!r}): whoever "
               "knows the run config, the server included, can regenerate and subtract it")
    else:
        try:
            entries = planned_entries(config, instruction, dataset_size=dataset_size)
        except Exception:  # noqa: BLE001  (the rule refuses a malformed instruction with its own error)
            return None
        assumed = sorted({e.params["assumption"] for e in entries if "assumption" in e.params})
        if assumed:
            why = f"this run's epsilon is not a guarantee: it assumes {'; and '.join(assumed)}"
    return None if why is None else (f"refused: this node's data owner caps its epsilon at {cap:g} (node config "
                                     f"max-epsilon), and {why}")


def node_run_config(context: Context) -> RunConfig:
    """The validated run config with node-level overrides applied: data-dir, and the data owner's max-epsilon
    as the budget where it is below the run's (a private run only: a non-private one is refused in train)."""
    raw = dict(context.run_config)
    if context.node_config.get("data-dir"):
        raw["data-dir"] = str(context.node_config["data-dir"])
    config = _config(tuple(sorted(raw.items())))
    cap = owner_cap(context.node_config)
    if cap is not None and is_private(config) and not 0 < config["target-epsilon"] <= cap:
        try:
            config = _config(tuple(sorted({**raw, "target-epsilon": cap}.items())))
        except ConfigError:
            if config["strategy"] != "ali-dpfl":
                raise
            # a cap below one DP-SGD step (R_c = 0, which validation refuses a run): the node enrolls, and
            # refuses every instruction for its budget (client/app.py check_instruction), as for any tau > R_c
            config = RunConfig({**config, "target-epsilon": cap})
    return config


def partition_of(context: Context, config: RunConfig) -> int:
    try:
        partition = int(context.node_config["partition-id"])
        num_partitions = int(context.node_config["num-partitions"])
    except KeyError as exc:
        raise NodeSetupError(
            f"node config lacks {exc.args[0]!r}; start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from None
    if num_partitions != config["num-clients"]:
        raise NodeSetupError(
            f"node config says num-partitions = {num_partitions} but the run has num-clients = "
            f"{config['num-clients']}; in simulation pass --federation-config 'num-supernodes={config['num-clients']}'"
        )
    if not 0 <= partition < num_partitions:
        raise NodeSetupError(f"partition-id {partition} is outside 0..{num_partitions - 1}")
    return partition


class LocalClient:
    """One partition's data and model, on this node's device."""

    def __init__(self, config: RunConfig, partition: int, run_id: int = 0, node_config: dict | None = None,
                 model: torch.nn.Module | None = None):
        self.config, self.partition = config, partition
        self.run_id, self.node_config = run_id, dict(node_config or {})
        self.device = pick_device(str(config["device"]))
        data = load_client(config, partition)
        self.num_train = data.num_train
        self.x = torch.as_tensor(data.x_train, device=self.device)
        self.y = torch.as_tensor(data.y_train, device=self.device)
        self.x_test, self.y_test = data.x_test, data.y_test
        if model is None:
            federation = load_federation(config)  # cached per process
            name = resolve_model_name(str(config["model"]), str(config["dataset"]))
            model = build_model(name, federation.input_shape, federation.num_classes).to(self.device)
        self.model = model  # every rule loads the instruction's arrays into it first

    @property
    def ledger(self):
        """This partition's privacy ledger for this run, read from disk on every access: other processes
        (Ray actors) serving this partition record in the same file, so a copy kept here goes stale."""
        from client.privacy import open_ledger

        return open_ledger(self.config, self.node_config, self.run_id, self.partition)


_local: dict[tuple, LocalClient] = {}


def local_client(context: Context) -> LocalClient:
    config = node_run_config(context)
    partition = partition_of(context, config)
    run_key = (context.run_id, tuple(sorted(config.items())))
    if _local and next(iter(_local))[0] != run_key:
        _local.clear()  # one run per process at a time; free the previous run's clients
    key = (run_key, partition)  # a process may serve several nodes (in-process engine, a Ray actor)
    if key not in _local:  # the nodes of a process take turns: one model serves them all
        shared = next(iter(_local.values())).model if _local else None
        _local[key] = LocalClient(config, partition, context.run_id, dict(context.node_config), model=shared)
    return _local[key]
