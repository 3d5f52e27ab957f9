"""The privfed ClientApp: thin Flower handlers that dispatch to local update rules.

A node learns who it is from its node config: `partition-id` and
`num-partitions` (filled in by Flower's simulation; passed with
`flower-supernode --node-config` in deployment), plus optional `data-dir`
(beats the run config's, since data lives where the node is).

Loaded data and models are kept per process (`_local`), so a simulation
actor that serves many messages reads its partition once.
"""

from __future__ import annotations

import functools

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.updates.sgd import train_sgd
from common.config import RunConfig, validate
from common.data import load_client, load_federation
from common.evaluation import evaluate, pick_device
from common.models import build_model, resolve_model_name
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays
from common.seeding import torch_generator

app = ClientApp()


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

    def __init__(self, config: RunConfig, partition: int):
        self.config, self.partition = config, partition
        self.device = pick_device(str(config["device"]))
        data = load_client(config, partition)
        self.num_train = data.num_train
        self.x = torch.as_tensor(data.x_train, device=self.device)
        self.y = torch.as_tensor(data.y_train, device=self.device)
        self.x_test, self.y_test = data.x_test, data.y_test
        federation = load_federation(config)  # cached per process
        name = resolve_model_name(str(config["model"]), str(config["dataset"]))
        self.model = build_model(name, federation.input_shape, federation.num_classes).to(self.device)


_local: dict[tuple, LocalClient] = {}


def local_client(context: Context) -> LocalClient:
    config = node_run_config(context)
    partition = partition_of(context, config)
    key = (context.run_id, partition, tuple(sorted(config.items())))
    if key not in _local:
        _local.clear()  # one run per process at a time; free the previous one
        _local[key] = LocalClient(config, partition)
    return _local[key]


@app.query("enroll")
def enroll(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds and how much data it has."""
    client = local_client(context)
    reply = ConfigRecord({
        "partition-id": client.partition,
        "num-partitions": int(context.node_config["num-partitions"]),
        "num-examples": client.num_train,
    })
    return Message(RecordDict({CONFIG: reply}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    client = local_client(context)
    config, instruction = client.config, msg.content[CONFIG]
    load_arrays(client.model, msg.content[ARRAYS])
    server_round = int(instruction["server-round"])
    epochs = int(instruction.get("local-epochs", config["local-epochs"]))
    loss = train_sgd(
        client.model, client.x, client.y,
        epochs=epochs, batch_size=int(config["batch-size"]), lr=float(config["lr"]),
        momentum=float(config["momentum"]),
        generator=torch_generator(int(config["seed"]), "client-train", client.partition, server_round),
    )
    metrics = MetricRecord({NUM_EXAMPLES: client.num_train, "train-loss": loss})
    return Message(RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics}), reply_to=msg)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's own test split."""
    client = local_client(context)
    load_arrays(client.model, msg.content[ARRAYS])
    loss, accuracy = evaluate(client.model, client.x_test, client.y_test, client.device)
    metrics = MetricRecord({NUM_EXAMPLES: len(client.y_test), "loss": loss, "accuracy": accuracy})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)
