"""FedLAP replies carry images, not models: the server screens them and drops bad ones."""

from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Error, Message, MetricRecord, RecordDict
from flwr.common import Metadata

from client.updates.fedlap import RADIUS, SET_KEY, set_record
from server.strategies.fedlap import set_problem, train_on_sets

SHAPE = (1, 6, 6)


def _meta():
    return Metadata(run_id=1, message_id="", src_node_id=7, dst_node_id=0, reply_to_message_id="x", group_id="",
                    created_at=0.0, ttl=60.0, message_type="train")


def _reply(content=None, error=None):
    if error is not None:
        return Message(error=error, metadata=_meta())
    return Message(content=content, metadata=_meta())


def reply(images=None, labels=None, radius=1.0, n=100, extra=None, record=None):
    images = np.zeros((4, *SHAPE), np.float32) if images is None else images
    labels = np.array([1, 1, 3, 3]) if labels is None else labels
    content = {SET_KEY: record if record is not None else set_record(images, labels),
               "metrics": MetricRecord({"num-examples": n, RADIUS: radius})}
    content.update(extra or {})
    return _reply(RecordDict(content))


def problem(msg, max_examples=1000):
    return set_problem(msg, ipc=2, input_shape=SHAPE, num_classes=5, max_examples=max_examples)


def test_good_reply_passes():
    assert problem(reply()) is None


@pytest.mark.parametrize("kwargs,pattern", [
    ({"images": np.zeros((4, 1, 5, 6), np.float32)}, "images have shape"),
    ({"images": np.full((4, *SHAPE), np.nan, np.float32)}, "NaN"),
    ({"record": ArrayRecord(OrderedDict([("images", Array(np.full((4, *SHAPE), 1e300))),  # float64: inf once
                                          ("labels", Array(np.array([1, 1, 3, 3])))]))}, "float32"),  # cast
    ({"images": np.full((4, *SHAPE), 1e30, np.float32)}, "beyond"),  # finite, but it wrecks the model
    ({"labels": np.array([1, 1, 3, 9])}, "labels outside"),
    ({"labels": np.array([1, 1, 1, 3])}, "images per class"),
    ({"radius": float("inf")}, "radius"),
    ({"radius": -1.0}, "radius"),
    ({"n": 0}, "num-examples"),
    ({"n": 5000}, "exceeds"),
])
def test_bad_replies_are_named(kwargs, pattern):
    assert pattern in (problem(reply(**kwargs)) or "")


def test_missing_set_and_wrong_arrays():
    bad = ArrayRecord(OrderedDict([("weights", torch.zeros(3))]))
    assert "set arrays" in problem(reply(record=bad))
    no_set = _reply(RecordDict({"metrics": MetricRecord({"num-examples": 3})}))
    assert "no synthetic set" in problem(no_set)
    err = _reply(error=Error(code=1, reason="boom"))
    assert "boom" in problem(err)


def test_server_training_stops_at_radius():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(36, 5))
    x, y = torch.randn(4, *SHAPE), torch.tensor([1, 1, 3, 3])
    steps, moved, loss = train_on_sets(model, [(x, y, 0.5), (x, y, 0.5)], lr=0.5, radius=0.3, max_steps=100,
                                       batch=512, dsa=False, generator=torch.Generator().manual_seed(0))
    assert moved == pytest.approx(0.3, rel=1e-6) and steps < 100 and np.isfinite(loss)  # ends on the radius
    steps, _, _ = train_on_sets(model, [(x, y, 1.0)], lr=0.01, radius=None, max_steps=7, batch=2, dsa=True,
                                generator=torch.Generator().manual_seed(0))
    assert steps == 7
