"""The privfed ClientApp: thin Flower handlers that dispatch to the local
update rule of the run's strategy (`client/updates/`)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.node import local_client, owner_cap, owner_refusal
from client.privacy import (EARLIER_START, SERVER_STARTED, BudgetExhausted, EarlierStart, charges_recorded, claim,
                            ledger_path, refusal, report_and_fence)
from client.resume import LINEAGE, resumable, snapshot_folder
from client.secagg import SecureAggregationRefused, handle_enroll, handle_reveal, is_secure, secure_train
from client.updates import update_rule
from client.updates.acknowledged import ACKNOWLEDGED
from client.updates.fedlap import instructed_lr
from common.evaluation import evaluate
from common.number_checks import is_int
from common.privacy.ali import GRAD_DIFF_METRIC
from common.privacy.plan import BeyondBudget, is_private, local_epochs, local_steps, planned_entries, prox_mu
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, fitting_state, load_arrays
from common.seeding import global_torch_rng

app = ClientApp()

# The only train metrics a private run releases: none is computed from the data, so none leaks outside
# the DP accounting (the raw train-loss, a norm before clipping, FedLAP's match-loss would). Each is a
# data size, a ledger reading, a step count or a config value: fedlap-radius is r_k = r under DP, and
# the FedLAP server votes on it.
PRIVATE_METRICS = frozenset({NUM_EXAMPLES, "epsilon", "dp-steps", "fedlap-radius"})


def released_metrics(config) -> frozenset[str] | None:
    """The train metrics this run may release (None: all of them, a non-private run)."""
    if not is_private(config):
        return None
    if config["strategy"] == "ali-dpfl" and config["ali-mu-estimator"] == "paper":
        return PRIVATE_METRICS | {GRAD_DIFF_METRIC}  # the paper's named leak, logged by its rule
    return PRIVATE_METRICS


class UnchargedRelease(RuntimeError):
    """A private run's rule replied without charging the node's ledger: nothing is released."""


def rule_name(rule) -> str:
    return f"{getattr(rule, '__module__', '?')}.{getattr(rule, '__qualname__', repr(rule))}"


def private_release(rule, config, name: str | None = None):
    """`rule`, its reply's metrics cut to `released_metrics` in a private run: every train reply
    leaves through here, masked or not. A safety net for every mechanism: a reply is refused
    (`UnchargedRelease`, nothing released) if the rule did not charge the node's ledger although the
    instruction plans entries (`planned_entries`); the rules charge themselves, after their own checks.
    `name`: the rule's, for that error (default: `rule`'s own)."""
    allowed = released_metrics(config)
    if allowed is None:
        return rule
    name = name or rule_name(rule)

    def run(client, content: RecordDict, state: RecordDict) -> RecordDict:
        before = charges_recorded()  # counted in this process: no second read of the ledger file
        reply = rule(client, content, state)
        if charges_recorded() == before and planned_entries(config, content[CONFIG], dataset_size=client.num_train):
            raise UnchargedRelease(
                f"the update rule {name} (privacy {config['privacy']!r}, strategy {config['strategy']!r}) "
                f"replied without charging this node's privacy ledger: nothing is released. A private rule must "
                f"call client.privacy.charge(client.ledger, config, planned_entries(config, instruction, "
                f"dataset_size=client.num_train)) before anything derived from the data leaves it")
        for name_, record in list(reply.items()):
            if isinstance(record, MetricRecord):
                reply[name_] = MetricRecord({k: v for k, v in record.items() if k in allowed})
        return reply
    return run


@app.query("enroll")
def enroll(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds and how much data it has; in a resumable private
    run also what its ledger holds of the last round (`report_and_fence`)."""
    client = local_client(context)
    reply = ConfigRecord({
        "partition-id": client.partition,
        "num-partitions": int(context.node_config["num-partitions"]),
        "num-examples": client.num_train,
    })
    if is_private(client.config) and client.config["checkpoint"]:  # its ledger outlives this server start
        started = msg.content.config_records.get(CONFIG, {}).get(SERVER_STARTED)
        started = started if type(started) is int else None  # an older server sends none
        try:
            reply.update(report_and_fence(ledger_path(client.config, client.node_config, client.run_id,
                                                      client.partition), client.run_id, started))
        except EarlierStart as refused:  # the server's enrollment fails, naming the node and the clocks
            return Message(Error(code=EARLIER_START, reason=str(refused)), reply_to=msg)
    return Message(RecordDict({CONFIG: reply}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    client = local_client(context)
    instruction = msg.content.config_records.get(CONFIG, ConfigRecord())
    if why := owner_refusal(context.node_config, client.config, instruction, client.num_train):
        return refusal(msg, BudgetExhausted(why))
    base = update_rule(str(client.config["strategy"]), str(client.config["privacy"]))
    rule = resumable(base, snapshot_folder(client.config, context.node_config, client.partition))
    rule = private_release(checked(rule), client.config, rule_name(base))
    try:
        if client.config["secure-aggregation"]:  # reply with a masked vector (client/secagg.py)
            return secure_train(rule, client, msg, context)
        if is_secure(msg):  # a server faking secure aggregation would get the masking credit for nothing
            raise SecureAggregationRefused("the train message announces secure aggregation, but this run has "
                                           "secure-aggregation = false")
        return Message(rule(client, msg.content, context.state), reply_to=msg)
    except BudgetExhausted as refused:  # a typed refusal, not a crash
        return refusal(msg, refused)


def checked(rule):
    """`rule`, run only on an instruction `check_instruction` accepts, with torch's global generators
    keyed by (run seed, partition, training round): a model's dropout masks draw from them, and they must
    not depend on what ran before in this process (other nodes, a resumed server, another engine)."""
    def run(client, content: RecordDict, state: RecordDict) -> RecordDict:
        check_instruction(client, content)
        instruction = content[CONFIG]
        train_round = int(instruction.get("train-round", instruction["server-round"]))
        with global_torch_rng(int(client.config["seed"]), "client-global", client.partition, train_round,
                              device=client.device):
            return rule(client, content, state)
    return run


def check_instruction(client, content: RecordDict) -> None:
    """Refuse now what an update rule would refuse only after charging the ledger: a refusal after the
    charge would record a release that never happened. A model that is not finite is refused too: its
    NaN update would pass output perturbation's clipping (max(1, NaN / tau) = 1) unclipped."""
    if not isinstance(content.get(CONFIG), ConfigRecord) or not isinstance(content.get(ARRAYS), ArrayRecord):
        raise ValueError(f"a train instruction holds a ConfigRecord {CONFIG!r} and an ArrayRecord {ARRAYS!r}")
    instruction = content[CONFIG]
    for key in ("server-round", "train-round", ACKNOWLEDGED):
        value = instruction.get(key, 0)
        if not is_int(value) or value < 0:
            raise ValueError(f"the instruction's {key!r} must be a non-negative integer, got {value!r}")
    if "server-round" not in instruction:
        raise ValueError("the instruction has no 'server-round'")
    received, model = fitting_state(client.model, content[ARRAYS]), client.model.state_dict()
    # in the model's dtype: float64 1e300 is finite, and infinite once loaded into a float32 model
    if not all(bool(torch.isfinite(v.to(model[k].dtype)).all()) for k, v in received.items() if v.is_floating_point()):
        raise ValueError("the instruction's model holds NaN or infinite values (in the model's dtype)")
    if is_private(client.config) and LINEAGE in instruction:  # a resumable run: its ledger is the run-name's
        claim(client.ledger, str(instruction[LINEAGE]))
    if "local-epochs" in instruction:
        local_epochs(client.config, instruction)
    if client.config["privacy"] == "dpsgd" and client.config["strategy"] != "fedlap":
        try:
            local_steps(client.config, instruction)
        except BeyondBudget as over:  # the server retires a refusing node, and takes back the steps it planned
            raise BudgetExhausted(f"refused: {over}") from None
    if client.config["strategy"] == "fedprox":
        prox_mu(client.config, instruction)
    if client.config["strategy"] == "fedlap":
        instructed_lr(client.config, instruction)


@app.query("secagg_enroll")
def secagg_enroll(msg: Message, context: Context) -> Message:
    """Secure aggregation: a key pair for this run; reply with the public key."""
    client = local_client(context)
    if not client.config["secure-aggregation"]:
        raise SecureAggregationRefused("asked to enroll in secure aggregation, but this run has "
                                       "secure-aggregation = false")
    return handle_enroll(msg, context, client.config, client.num_train)


@app.query("secagg_reveal")
def secagg_reveal(msg: Message, context: Context) -> Message:
    """Secure aggregation, after a dropout: this round's masks with the dropped nodes."""
    return handle_reveal(msg, context, local_client(context).config)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's own test split (non-private runs only)."""
    client = local_client(context)
    if is_private(client.config):  # loss and accuracy of server-chosen models probe the test records
        raise PermissionError("a private run releases no client-side evaluation (it is outside the privacy "
                              "accounting): evaluate the global model on the server")
    if owner_cap(context.node_config) is not None:
        raise PermissionError("this node's data owner caps its epsilon (node config max-epsilon): it releases "
                              "no client-side evaluation, which no privacy mechanism covers")
    load_arrays(client.model, msg.content[ARRAYS])
    loss, accuracy = evaluate(client.model, client.x_test, client.y_test, client.device)
    metrics = MetricRecord({NUM_EXAMPLES: len(client.y_test), "loss": loss, "accuracy": accuracy})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)
