"""What a node knows about itself: its validated run config, its partition,
and its data and model, kept per process across messages.

A node learns who it is from its node config: `partition-id` and
`num-partitions` (filled in by Flower's simulation; passed with
`flower-supernode --node-config` in deployment), plus optional `data-dir`
(beats the run config's, since data lives where the node is).
"""

from __future__ import annotations

import functools

import torch
from flwr.app import Context

from common.config import RunConfig, resolve_model_name, validate
from common.data import load_client, load_federation
from common.evaluation import pick_device
from common.models import build_model


class NodeSetupError(ValueError):
    """The node config does not fit the run (partition out of range, ...)."""


@functools.lru_cache(maxsize=8)
def _config(items: tuple) -> RunConfig:
    return validate(dict(items))


def node_run_config(context: Context) -> RunConfig:
    """The validated run config with node-level overrides (data-dir) applied."""
    raw = dict(context.run_config)
    if context.node_config.get("data-dir"):
        raw["data-dir"] = str(context.node_config["data-dir"])
    return _config(tuple(sorted(raw.items())))


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
