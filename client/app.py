"""The privfed ClientApp: thin Flower handlers that dispatch to the local
update rule of the run's strategy (`client/updates/`)."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.node import local_client
from client.updates import update_rule
from common.evaluation import evaluate
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays

app = ClientApp()


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
    rule = update_rule(str(client.config["strategy"]))
    return Message(rule(client, msg.content, context.state), reply_to=msg)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's own test split."""
    client = local_client(context)
    load_arrays(client.model, msg.content[ARRAYS])
    loss, accuracy = evaluate(client.model, client.x_test, client.y_test, client.device)
    metrics = MetricRecord({NUM_EXAMPLES: len(client.y_test), "loss": loss, "accuracy": accuracy})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)
