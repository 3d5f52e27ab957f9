"""The privfed ClientApp: thin Flower handlers that dispatch to the local
update rule of the run's strategy (`client/updates/`)."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.node import local_client
from client.privacy import BudgetExhausted, refusal
from client.resume import resumable, snapshot_folder
from client.secagg import handle_enroll, handle_reveal, is_secure, secure_train
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
    rule = resumable(update_rule(str(client.config["strategy"]), str(client.config["privacy"])),
                     snapshot_folder(client.config, context.node_config, client.partition))
    try:
        if client.config["secure-aggregation"] or is_secure(msg):  # reply with a masked vector (client/secagg.py)
            return secure_train(rule, client, msg, context)
        return Message(rule(client, msg.content, context.state), reply_to=msg)
    except BudgetExhausted as refused:  # a typed refusal, not a crash
        return refusal(msg, refused)


@app.query("secagg_enroll")
def secagg_enroll(msg: Message, context: Context) -> Message:
    """Secure aggregation: a key pair for this run; reply with the public key."""
    client = local_client(context)
    return handle_enroll(msg, context, client.config, client.num_train)


@app.query("secagg_reveal")
def secagg_reveal(msg: Message, context: Context) -> Message:
    """Secure aggregation, after a dropout: this round's masks with the dropped nodes."""
    return handle_reveal(msg, context, local_client(context).config)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's own test split."""
    client = local_client(context)
    load_arrays(client.model, msg.content[ARRAYS])
    loss, accuracy = evaluate(client.model, client.x_test, client.y_test, client.device)
    metrics = MetricRecord({NUM_EXAMPLES: len(client.y_test), "loss": loss, "accuracy": accuracy})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)
