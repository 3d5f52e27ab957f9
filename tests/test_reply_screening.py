"""One malformed or adversarial reply is dropped with a log line; the round aggregates the others and the
server never crashes (server/replies.py, used by every model-averaging strategy)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from common.records import ARRAYS, METRICS, NUM_EXAMPLES
from server.roster import Roster
from server.strategies.fedavg import FedAvg

ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})
SHAPES = {"w": (2, 3), "b": (2,)}


@pytest.fixture(autouse=True, scope="module")
def task_identity():
    """Messages need a run/node identity, as the in-process grid sets it."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1


def model(value: float) -> ArrayRecord:
    return ArrayRecord({k: Array(np.full(s, value, np.float32)) for k, s in SHAPES.items()})


def with_w(w: Array) -> ArrayRecord:
    return ArrayRecord({"w": w, "b": Array(np.zeros(2, np.float32))})


def _npz() -> bytes:
    import io
    buf = io.BytesIO()
    np.savez(buf, w=np.zeros((2, 3), np.float32))
    return buf.getvalue()


NPZ = _npz()  # np.load returns an NpzFile for zip bytes, not an array

BAD_MODELS = {
    "strings": (with_w(Array(np.full((2, 3), "x"))), "<U1"),
    "complex": (with_w(Array(np.full((2, 3), 1j, np.complex64))), "complex64"),
    "float64": (with_w(Array(np.zeros((2, 3), np.float64))), "float64"),
    "shape": (with_w(Array(np.zeros((3, 2), np.float32))), "shape (3, 2)"),
    "nan": (with_w(Array(np.full((2, 3), np.nan, np.float32))), "NaN"),
    "unreadable": (with_w(Array(dtype="float32", shape=(2, 3), stype="numpy.ndarray", data=b"junk")),
                   "cannot be read"),
    "npz": (with_w(Array(dtype="float32", shape=(2, 3), stype="numpy.ndarray", data=NPZ)), "not an array"),
    "names": (ArrayRecord({"w": Array(np.zeros((2, 3), np.float32))}), "names differ"),
    "huge": (with_w(Array(np.full((2, 3), 1e25, np.float32))), "beyond"),  # overflows FedYogi's v
}


@pytest.mark.parametrize("name", BAD_MODELS)
def test_a_bad_reply_is_dropped_and_the_others_aggregate(name):
    bad, reason = BAD_MODELS[name]
    logs = []
    strategy = FedAvg(ROSTER, seed=1, fraction_train=1.0, log=logs.append)
    messages = list(strategy.configure_train(1, model(0.0), ConfigRecord(), None))
    values = {101: 7.0, 102: 1.0, 103: 2.0}  # node 101 sends the bad reply instead of 7.0
    replies = []
    for msg in messages:
        node = msg.metadata.dst_node_id
        arrays = bad if node == 101 else model(values[node])
        n = ROSTER.num_examples[{v: k for k, v in ROSTER.node_of.items()}[node]]
        replies.append(Message(RecordDict({ARRAYS: arrays, METRICS: MetricRecord({NUM_EXAMPLES: n})}),
                               reply_to=msg))
    aggregated, _ = strategy.aggregate_train(1, replies)
    assert aggregated is not None
    expected = (30 * 1.0 + 60 * 2.0) / 90  # the two good replies, weighted by their examples
    for key, shape in SHAPES.items():
        np.testing.assert_allclose(aggregated[key].numpy(), np.full(shape, expected), rtol=1e-6)
        assert aggregated[key].numpy().dtype == np.float32
    assert len(logs) == 1 and "node 101" in logs[0] and reason in logs[0], logs


METRIC_CASES = {  # node 101's metrics besides num-examples -> the round's aggregated metrics
    "missing": ({}, {}),
    "list": ({"train-loss": [1.0, 2.0]}, {}),
    "extra": ({"train-loss": 1.0, "zzz": 3.0}, {"train-loss": 1.0}),
    "nan": ({"train-loss": float("nan")}, {"train-loss": float("nan")}),  # DP-SGD with only empty batches
}


@pytest.mark.parametrize("name", METRIC_CASES)
def test_odd_metrics_do_not_crash_the_round_or_drop_the_model(name):
    """Flower raises on differing metric keys and cannot average a list: the model still aggregates."""
    odd, expected = METRIC_CASES[name]
    logs = []
    strategy = FedAvg(ROSTER, seed=1, fraction_train=1.0, log=logs.append)
    replies = []
    for msg in strategy.configure_train(1, model(0.0), ConfigRecord(), None):
        node = msg.metadata.dst_node_id
        metrics = {NUM_EXAMPLES: 10, **(odd if node == 101 else {"train-loss": 1.0})}
        replies.append(Message(RecordDict({ARRAYS: model(float(node)), METRICS: MetricRecord(metrics)}),
                               reply_to=msg))
    aggregated, metrics = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(aggregated["w"].numpy(), np.full((2, 3), 102.0))  # all three, equal weights
    assert sorted(metrics) == sorted(expected)
    np.testing.assert_equal(dict(metrics), expected)
    assert (len(logs) == 1) == (name != "nan"), logs


def test_a_reply_under_other_record_names_is_dropped():
    """Flower raises when the replies' record names differ: screening drops such a reply first."""
    logs = []
    strategy = FedAvg(ROSTER, seed=1, fraction_train=1.0, log=logs.append)
    replies = []
    for msg in strategy.configure_train(1, model(0.0), ConfigRecord(), None):
        name = "x" if msg.metadata.dst_node_id == 101 else ARRAYS
        replies.append(Message(RecordDict({name: model(1.0), METRICS: MetricRecord({NUM_EXAMPLES: 10})}),
                               reply_to=msg))
    aggregated, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(aggregated["w"].numpy(), np.ones((2, 3)))
    assert len(logs) == 1 and "node 101" in logs[0] and "'x'" in logs[0]


@pytest.mark.parametrize("n_test", [float("inf"), 1e300])
def test_pfedme_ignores_an_absurd_test_size(n_test):
    """pFedMe weighted the personal accuracies by the reported test sizes: inf crashed int(), 1e300 took
    over. It now weights by the test sizes it loads itself: the claim changes nothing."""
    from server.strategies.pfedme import PFedMe

    strategy = PFedMe(ROSTER, seed=1, fraction_train=1.0, log=lambda _: None, test_sizes={0: 5, 1: 5, 2: 5})
    replies = []
    for msg in strategy.configure_train(1, model(0.0), ConfigRecord(), None):
        hostile = msg.metadata.dst_node_id == 101
        metrics = {NUM_EXAMPLES: 10, "personal-accuracy": 0.0 if hostile else 0.9,
                   "test-examples": n_test if hostile else 5}
        replies.append(Message(RecordDict({ARRAYS: model(1.0), METRICS: MetricRecord(metrics)}), reply_to=msg))
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["personal-accuracy"] == pytest.approx((0.9 * 5 * 2 + 0.0 * 5) / 15)
    assert metrics["personal-clients"] == 3


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
STRANGER = 99999  # a node id the roster does not hold


def _replies_with_a_stranger(strategy, metrics_of=lambda node: {}):
    """Good replies to every instruction; node 101's claims to come from STRANGER (Flower's grids would not
    pass it, another grid might)."""
    replies = []
    for msg in strategy.configure_train(1, model(0.0), ConfigRecord(), None):
        node = msg.metadata.dst_node_id
        reply = Message(RecordDict({ARRAYS: model(float(node)), METRICS: MetricRecord(
            {NUM_EXAMPLES: 10, **metrics_of(node)})}), reply_to=msg)
        if node == 101:
            reply.metadata.__dict__["_src_node_id"] = STRANGER
        replies.append(reply)
    return replies


def _strategy(name):
    logs = []
    if name == "fedavg":
        return FedAvg(ROSTER, seed=1, fraction_train=1.0, log=logs.append), logs, {}
    if name == "pfedme":
        from server.strategies.pfedme import PFedMe

        return (PFedMe(ROSTER, seed=1, fraction_train=1.0, log=logs.append, test_sizes={0: 5, 1: 5, 2: 5}), logs,
                {"personal-accuracy": 0.5})
    from common.config import validate
    from server.strategies.ali_dpfl import AliDpfl

    config = validate({"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 5.0, "num-clients": 3,
                       "num-rounds": 3, "dataset": "synthetic"})
    return AliDpfl(ROSTER, seed=1, fraction_train=1.0, log=logs.append, config=config), logs, {}


@pytest.mark.parametrize("name", ["fedavg", "pfedme", "ali-dpfl"])
def test_a_reply_from_a_node_outside_the_roster_is_dropped(name):
    """Screening let such a reply through (its example cap unknown): FedAvg, SCAFFOLD and FedDyn aggregated it
    (never acknowledging it: their c / h drifted), pFedMe and ALI-DPFL raised KeyError: 99999."""
    strategy, logs, metrics = _strategy(name)
    arrays, _ = strategy.aggregate_train(1, _replies_with_a_stranger(strategy, lambda node: metrics))
    assert any(f"from node {STRANGER}: not a node of this run" in line for line in logs)
    if name != "pfedme":  # pFedMe's server step mixes in the previous global model
        assert arrays["b"].numpy() == pytest.approx([102.5, 102.5])  # nodes 102 and 103, 10 examples each
