"""FedLAP-DP: hostile or unusual replies and configs, one regression test each."""

from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common import Metadata

from client.updates.fedlap import RADIUS, SET_KEY, set_record
from common.config import ConfigError, validate
from common.fedlap.augment import augment
from common.records import model_to_arrays
from server.roster import Roster
from server.strategies.fedlap import FedLap

pytestmark = pytest.mark.timeout(120)


def _strategy(**over):
    config = validate({"strategy": "fedlap", "num-clients": 2, "fedlap-dsa": False, "fedlap-ipc": 2,
                       "fedlap-radius": 10.0, "fedlap-server-steps": 3, **over})
    strategy = FedLap(Roster({0: 10, 1: 11}, {0: 100, 1: 100}), 0, 1.0, log=lambda _: None, config=config)
    strategy._sent = model_to_arrays(strategy.model)
    return strategy


def _reply(strategy, node, labels, radius=1.0):
    meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="x",
                    group_id="", created_at=0.0, ttl=60.0, message_type="train")
    record = ArrayRecord(OrderedDict([("images", Array(np.zeros((4, *strategy.input_shape), np.float32))),
                                      ("labels", Array(labels))]))
    metrics = MetricRecord({"num-examples": 50, RADIUS: radius})
    return Message(content=RecordDict({SET_KEY: record, "metrics": metrics}), metadata=meta)


def test_dsa_on_non_image_data_is_a_clear_error():
    # the default dataset (Synthetic) has flat features: DSA used to crash every client every round
    # deep in affine_grid, and the run "finished" without training
    with pytest.raises(ConfigError, match="fedlap-dsa"):
        _strategy(**{"fedlap-dsa": True})
    with pytest.raises(ValueError, match="image batches"):
        augment(torch.zeros(3, 60), 0)


def test_big_endian_labels_do_not_crash_the_server():
    strategy = _strategy()
    bad = _reply(strategy, 10, np.array([0, 0, 1, 1], dtype=">i8"))  # passes the screen: integer labels
    good = _reply(strategy, 11, np.array([0, 0, 1, 1], np.uint8))
    arrays, metrics = strategy.aggregate_train(1, [bad, good])
    assert arrays is not None and metrics["sets"] == 2


def test_radius_beyond_the_trust_region_is_refused():
    strategy = _strategy(**{"fedlap-server-radius": "max"})
    forged = _reply(strategy, 10, np.array([0, 0, 1, 1], np.uint8), radius=1e9)  # honest r_k <= r
    good = _reply(strategy, 11, np.array([0, 0, 1, 1], np.uint8), radius=10.0)
    _, metrics = strategy.aggregate_train(1, [forged, good])
    assert metrics["sets"] == 1 and metrics["server-radius"] == 10.0


def test_labels_beyond_uint8_keep_their_value():
    labels = np.array([300, 300, 5, 5])
    record = set_record(np.zeros((4, 3), np.float32), labels)
    assert record["labels"].numpy().tolist() == labels.tolist()
    assert record["labels"].numpy().dtype == np.int64
    assert set_record(np.zeros((2, 3), np.float32), np.array([1, 2]))["labels"].numpy().dtype == np.uint8


@pytest.mark.parametrize("key", ["images", "labels"])
def test_npz_payload_is_named_not_a_crash(key):
    # np.load of zip bytes returns an NpzFile, not an array: the screen used to hit .dtype on it
    import io

    strategy = _strategy()
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros(3))
    forged = Array(dtype="float32", shape=(4, *strategy.input_shape), stype="numpy.ndarray", data=buf.getvalue())
    msg = _reply(strategy, 10, np.array([0, 0, 1, 1], np.uint8))
    msg.content[SET_KEY][key] = forged
    good = _reply(strategy, 11, np.array([0, 0, 1, 1], np.uint8))
    _, metrics = strategy.aggregate_train(1, [msg, good])
    assert metrics["sets"] == 1


def test_dp_server_trains_within_the_fixed_radius_r_not_a_client_supplied_one():
    """Sec. 4.4 / Alg. 3: under DP the server uses the local radius r, no data-dependent r_g. Honest DP clients
    send r_k = r, so a smaller r_k is forged: with the min vote one reply of 1e-6 set every round's server step
    (measured: server-radius 1e-06, one step; review of session 18)."""
    strategy = _strategy(privacy="dpsgd", **{"dp-sample-rate": 0.1, "fedlap-radius": 1.5,
                                             "fedlap-server-steps": 50, "lr": 0.5})
    honest = _reply(strategy, 10, np.array([0, 0, 1, 1], np.uint8), radius=1.5)
    forged = _reply(strategy, 11, np.array([2, 2, 3, 3], np.uint8), radius=1e-6)
    for seed, msg in enumerate((honest, forged)):
        images = np.random.default_rng(seed).normal(size=(4, *strategy.input_shape)).astype(np.float32)
        msg.content[SET_KEY]["images"] = Array(images)
    _, metrics = strategy.aggregate_train(1, [honest, forged])
    assert metrics["server-radius"] == pytest.approx(1.5)
    assert metrics["server-moved"] == pytest.approx(1.5, rel=1e-6) or metrics["server-steps"] == 50


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_one_screened_in_reply_moves_the_model_no_further_than_the_trust_region():
    """Images at the screen's limit (|x| = MAX_ABS_VALUE = 1e6, finite) pass set_problem; one server step on them
    moved the global model 4.7e5 with r_g = 1, every weight below 1e6, so nothing marked the round diverged. The
    step that crosses r_g now ends on it (Eq. 14: ||w - w_0|| <= r_g)."""
    from tests.test_fedlap_end_to_end import _reply as reply_with_images

    strategy = _strategy(**{"fedlap-server-steps": 5, "fedlap-radius": 10.0})
    start = torch.cat([p.detach().flatten().clone() for p in strategy.model.parameters()])
    bad = reply_with_images(strategy, 10, np.array([0, 0, 1, 1], np.uint8),
                            images=np.full((4, *strategy.input_shape), 1e6, np.float32), radius=1.0)
    good = reply_with_images(strategy, 11, np.array([2, 2, 3, 3], np.uint8), radius=1.0)
    _, metrics = strategy.aggregate_train(1, [bad, good])
    moved = float((torch.cat([p.detach().flatten() for p in strategy.model.parameters()]) - start).norm())
    assert metrics["server-radius"] == 1.0 and metrics["server-steps"] == 1
    assert moved == pytest.approx(1.0, rel=1e-5) and metrics["server-moved"] == pytest.approx(1.0, rel=1e-5)


def test_fedlap_drops_a_reply_from_a_node_outside_the_roster():
    """FedLAP screens with its own `usable`, which did not check the sender: a stranger's synthetic set was
    trained on, its self-declared num-examples unchecked, so it outweighed the real clients (10**6 vs 50)."""
    from common.records import model_to_arrays

    logs = []
    config = validate({"strategy": "fedlap", "num-clients": 2, "fedlap-dsa": False, "fedlap-ipc": 2,
                       "fedlap-radius": 10.0, "fedlap-server-steps": 3})
    strategy = FedLap(Roster({0: 10, 1: 11}, {0: 100, 1: 100}), 0, 1.0, log=logs.append, config=config)
    strategy._sent = model_to_arrays(strategy.model)

    def reply(node, n):
        meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="x",
                        group_id="", created_at=0.0, ttl=60.0, message_type="train")
        record = ArrayRecord(OrderedDict([("images", Array(np.zeros((4, *strategy.input_shape), np.float32))),
                                          ("labels", Array(np.array([0, 0, 1, 1], np.uint8)))]))
        return Message(content=RecordDict({SET_KEY: record, "metrics": MetricRecord({"num-examples": n,
                                                                                     RADIUS: 1.0})}),
                       metadata=meta)

    _, metrics = strategy.aggregate_train(1, [reply(99999, 10**6), reply(11, 50)])
    assert any("from node 99999: not a node of this run" in line for line in logs), logs
    assert metrics["sets"] == 1
