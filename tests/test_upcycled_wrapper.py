"""Upcycled-FL wrapper, unit level: the even-round extrapolation exactly, the
theta schedule, and server optimiser state left alone on even rounds."""

import copy

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp.strategy import Strategy
from flwr.supercore.task_identity import TaskIdentity

from client.updates.scaffold import CONTROL, CONTROL_DELTA
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES
from server.roster import Roster
from server.strategies.feddyn import FedDyn
from server.strategies.fedavgm import FedAvgM
from server.strategies.fedyogi import FedYogi
from server.strategies.scaffold import Scaffold
from server.strategies.upcycled import Upcycled, extrapolate, theta_schedule, training_round

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True, scope="module")
def task_identity():
    """Messages need a run/node identity, as the in-process grid sets it."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1


def rec(d):
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in d.items()})


def arrays(scale=1.0, counter=0):
    return rec({"w": (scale * RNG.normal(size=(3, 4))).astype(np.float32),
                "b": (scale * RNG.normal(size=4)).astype(np.float32),
                "count": np.array([counter], dtype=np.int64)})


def same(a: ArrayRecord, b: ArrayRecord):
    assert list(a.keys()) == list(b.keys())
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())


class FakeBase(Strategy):
    """Returns preset models from aggregate_train and records what it was called with."""

    def __init__(self, outputs):
        self.outputs, self.calls, self.round_map = outputs, [], None

    def configure_train(self, server_round, arrays, config, grid):
        self.calls.append(("configure", server_round, arrays))
        return ["a message"]

    def aggregate_train(self, server_round, replies):
        self.calls.append(("aggregate", server_round, list(replies)))
        return self.outputs[server_round], MetricRecord({"train-loss": 0.5})

    def configure_evaluate(self, server_round, arrays, config, grid):
        return ["an evaluation"]

    def aggregate_evaluate(self, server_round, replies):
        return None

    def summary(self):
        pass


def expected(w1: ArrayRecord, w0: ArrayRecord, theta: float) -> dict:
    out = {}
    for k in w1:
        a, b = w1[k].numpy(), w0[k].numpy()
        out[k] = a.copy() if a.dtype.kind != "f" else a + np.float32(theta) * (a - b)
    return out


def test_even_rounds_extrapolate_exactly_and_send_nothing():
    w0, w1, w3 = arrays(), arrays(counter=5), arrays(counter=9)
    base = FakeBase({1: w1, 3: w3})
    up = Upcycled(base, 0.7)
    assert list(up.configure_train(1, w0, ConfigRecord(), None)) == ["a message"]
    got1, _ = up.aggregate_train(1, ["reply"])
    assert got1 is w1
    assert list(up.configure_train(2, w1, ConfigRecord(), None)) == []
    w2, metrics = up.aggregate_train(2, [])
    want = expected(w1, w0, 0.7)
    for k in want:
        np.testing.assert_array_equal(w2[k].numpy(), want[k])
        assert w2[k].numpy().dtype == w1[k].numpy().dtype
    assert w2["count"].numpy()[0] == 5  # non-float arrays are copied, not extrapolated
    assert metrics["upcycled-theta"] == pytest.approx(0.7)
    # round 3 trains from the extrapolated model; round 4 extrapolates from w2 to w3
    up.configure_train(3, w2, ConfigRecord(), None)
    assert base.calls[-1][0] == "configure" and base.calls[-1][1] == 3 and base.calls[-1][2] is w2
    up.aggregate_train(3, [])
    up.configure_train(4, w3, ConfigRecord(), None)
    w4, _ = up.aggregate_train(4, [])
    want = expected(w3, w2, 0.7)
    for k in want:
        np.testing.assert_array_equal(w4[k].numpy(), want[k])
    # the base saw odd rounds only
    assert [c[1] for c in base.calls] == [1, 1, 3, 3]
    assert list(up.configure_evaluate(2, w2, ConfigRecord(), None)) == []
    assert list(up.configure_evaluate(3, w2, ConfigRecord(), None)) == ["an evaluation"]


def test_theta_zero_copies_and_no_reply_round_copies():
    w0, w1 = arrays(), arrays()
    up = Upcycled(FakeBase({1: w1}), 0.0)
    up.configure_train(1, w0, ConfigRecord(), None)
    up.aggregate_train(1, [])
    up.configure_train(2, w1, ConfigRecord(), None)
    same(up.aggregate_train(2, [])[0], w1)
    # an odd round without usable replies leaves the model where it was, and so does the even round
    base = FakeBase({1: None})
    up = Upcycled(base, 0.5)
    up.configure_train(1, w0, ConfigRecord(), None)
    assert up.aggregate_train(1, [])[0] is None
    up.configure_train(2, w0, ConfigRecord(), None)
    assert up.aggregate_train(2, []) == (None, None)


def test_extrapolate_formula_float64():
    w0 = rec({"x": np.array([1.0, 2.0])})
    w1 = rec({"x": np.array([2.0, 1.0])})
    np.testing.assert_allclose(extrapolate(w1, w0, 0.25)["x"].numpy(), [2.25, 0.75])


def test_theta_schedule_and_round_map():
    assert theta_schedule(0.3)(1) == theta_schedule(0.3)(50) == pytest.approx(0.3)
    const = theta_schedule(0.3, mu=0.5, lam=1.5)
    assert const(1) == const(9) == pytest.approx(0.25)
    grow = theta_schedule(0.3, mu=1.0, lam=2.0, growth=0.5)
    assert [grow(m) for m in (1, 4, 16)] == pytest.approx([1 / 3, 1 / 5, 1 / 9])
    # theta_m * sqrt(m) stays bounded: O(1/sqrt(m)) (Corollary 5.8)
    assert grow(10_000) * 100 == pytest.approx(1 / 2, rel=0.01)
    assert [training_round(t) for t in range(1, 7)] == [1, 1, 2, 2, 3, 3]
    base = FakeBase({})
    Upcycled(base, 0.3)
    assert base.round_map is training_round


# --- real server optimisers under the wrapper ----------------------------------
ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})


def model(scale=1.0):
    return rec({"w": (scale * RNG.normal(size=(2, 3))).astype(np.float32),
                "b": (scale * RNG.normal(size=2)).astype(np.float32)})


def replies_to(messages, models, control=False):
    out = []
    for msg, w in zip(messages, models):
        p = {n: k for k, n in ROSTER.node_of.items()}[msg.metadata.dst_node_id]
        content = {ARRAYS: w, METRICS: MetricRecord({NUM_EXAMPLES: ROSTER.num_examples[p], "train-loss": 1.0})}
        if control:
            content[CONTROL_DELTA] = rec({k: RNG.normal(size=a.numpy().shape).astype(np.float32)
                                          for k, a in w.items()})
        out.append(Message(RecordDict(content), reply_to=msg))
    return out


def weighted_average(messages, models):
    weights = [ROSTER.num_examples[{n: k for k, n in ROSTER.node_of.items()}[m.metadata.dst_node_id]]
               for m in messages]
    total = sum(weights)
    return {k: sum(w[k].numpy() * (n / total) for w, n in zip(models, weights)) for k in models[0]}


def state_of(strategy):
    if isinstance(strategy, FedAvgM):
        return copy.deepcopy(strategy.momentum_vector)
    if isinstance(strategy, FedYogi):
        return copy.deepcopy((strategy.m_t, strategy.v_t))
    if isinstance(strategy, FedDyn):
        return copy.deepcopy(strategy.h)
    return None


def assert_state_equal(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_state_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_state_equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make", [
    lambda: FedAvgM(ROSTER, 1, 1.0, server_momentum=0.3),
    lambda: FedYogi(ROSTER, 1, 1.0),
    lambda: FedDyn(ROSTER, 1, 1.0, alpha=0.01),
], ids=["fedavgm", "fedyogi", "feddyn"])
def test_server_optimiser_state_untouched_on_even_rounds(make):
    base = make()
    up = Upcycled(base, 0.5, log=lambda _: None)
    w0 = model()
    msgs = list(up.configure_train(1, w0, ConfigRecord(), None))
    assert len(msgs) == 3
    w1, _ = up.aggregate_train(1, replies_to(msgs, [model() for _ in msgs]))
    before = state_of(base)
    assert before is not None
    assert list(up.configure_train(2, w1, ConfigRecord(), None)) == []
    w2, _ = up.aggregate_train(2, [])
    assert_state_equal(state_of(base), before)
    # round 3 takes its step from the extrapolated model w2 (what the clients trained from)
    msgs = list(up.configure_train(3, w2, ConfigRecord(), None))
    assert all(m.content[CONFIG]["train-round"] == 2 and m.content[CONFIG]["server-round"] == 3 for m in msgs)
    same(msgs[0].content[ARRAYS], w2)
    if isinstance(base, FedAvgM):
        models = [model() for _ in msgs]
        w3, _ = up.aggregate_train(3, replies_to(msgs, models))
        avg = weighted_average(msgs, models)
        beta = 0.3
        for k in avg:
            g = w2[k].numpy() - avg[k]
            buf = beta * before[list(w2.keys()).index(k)] + g
            np.testing.assert_allclose(w3[k].numpy(), w2[k].numpy() - (g + beta * buf), rtol=1e-5, atol=1e-6)


def test_fedavgm_is_torch_nesterov_sgd():
    base = FedAvgM(ROSTER, 1, 1.0, server_momentum=0.3)
    x = model()
    param = {k: torch.nn.Parameter(torch.tensor(a.numpy().astype(np.float64))) for k, a in x.items()}
    opt = torch.optim.SGD(list(param.values()), lr=1.0, momentum=0.3, nesterov=True)
    for server_round in (1, 2, 3):
        msgs = list(base.configure_train(server_round, x, ConfigRecord(), None))
        models = [model() for _ in msgs]
        x, _ = base.aggregate_train(server_round, replies_to(msgs, models))
        avg = weighted_average(msgs, models)
        opt.zero_grad()
        for k, p in param.items():
            p.grad = p.detach() - torch.tensor(avg[k].astype(np.float64))
        opt.step()
        for k, p in param.items():
            np.testing.assert_allclose(x[k].numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_fedavgm_heavy_ball_is_flowers_update():
    base = FedAvgM(ROSTER, 1, 1.0, server_momentum=0.3, nesterov=False)
    x = model()
    msgs = list(base.configure_train(1, x, ConfigRecord(), None))
    models = [model() for _ in msgs]
    x1, _ = base.aggregate_train(1, replies_to(msgs, models))
    avg = weighted_average(msgs, models)
    for k in avg:  # first step: buf = g, x1 = x - g = average
        np.testing.assert_allclose(x1[k].numpy(), avg[k], rtol=1e-5, atol=1e-6)


def test_scaffold_control_variate_upcycled_as_authors_code():
    base = Scaffold(ROSTER, 1, 2 / 3)
    up = Upcycled(base, 0.4, log=lambda _: None)
    w0 = model()
    msgs = list(up.configure_train(1, w0, ConfigRecord(), None))
    assert len(msgs) == 2
    for m in msgs:
        assert all(np.all(a.numpy() == 0) for a in m.content[CONTROL].values())
    replies = replies_to(msgs, [model() for _ in msgs], control=True)
    w1, _ = up.aggregate_train(1, replies)
    step = {k: sum(r.content[CONTROL_DELTA][k].numpy().astype(np.float64) for r in replies) / 3 for k in w0}
    for k in w0:
        np.testing.assert_allclose(base.control[k], step[k], rtol=1e-6)
    assert list(up.configure_train(2, w1, ConfigRecord(), None)) == []
    up.aggregate_train(2, [])
    for k in w0:  # c += theta (1/N) sum delta c_i, reusing round 1's sum
        np.testing.assert_allclose(base.control[k], 1.4 * step[k], rtol=1e-6)
    msgs = list(up.configure_train(3, up.aggregate_train(2, [])[0], ConfigRecord(), None))
    for k in w0:
        np.testing.assert_allclose(msgs[0].content[CONTROL][k].numpy(), base.control[k])


def test_scaffold_screens_bad_control_replies_without_crashing():
    logs = []
    base = Scaffold(ROSTER, 1, 1.0, log=logs.append)
    msgs = list(base.configure_train(1, model(), ConfigRecord(), None))
    replies = replies_to(msgs, [model() for _ in msgs], control=True)
    replies[0].content[CONTROL_DELTA] = rec({"w": np.full((2, 3), np.nan, np.float32),
                                             "b": np.zeros(2, np.float32)})
    del replies[1].content[CONTROL_DELTA]
    arrays, _ = base.aggregate_train(1, replies)
    assert arrays is not None
    same(arrays, replies[2].content[ARRAYS])
    assert len(logs) == 2 and "NaN" in logs[0] and "control-delta" in logs[1]
    # nothing usable: no model, no crash, control unchanged
    assert base.aggregate_train(1, replies[:2]) == (None, None)


def test_feddyn_server_formula():
    base = FedDyn(ROSTER, 1, 2 / 3, alpha=0.1)
    x = model()
    msgs = list(base.configure_train(1, x, ConfigRecord(), None))
    models = [model() for _ in msgs]
    new, _ = base.aggregate_train(1, replies_to(msgs, models))
    for k in x:
        ws = [m[k].numpy().astype(np.float64) for m in models]
        h = -0.1 * sum(w - x[k].numpy() for w in ws) / 3
        np.testing.assert_allclose(base.h[k], h, rtol=1e-6)
        np.testing.assert_allclose(new[k].numpy(), sum(ws) / 2 - h / 0.1, rtol=1e-5, atol=1e-6)


def test_a_lambda_schedule_with_mu_zero_is_refused_not_silently_vanilla():
    """theta_m = mu/(mu+lambda_m) = 0 for mu = 0: every even round would copy the model (reviewer's finding)."""
    from common.config import ConfigError, validate

    with pytest.raises(ConfigError, match="upcycled-mu > 0"):
        validate({"strategy": "fedavg", "upcycled": True, "upcycled-lambda": 1.0, "upcycled-mu": 0.0})
    assert validate({"strategy": "fedavg", "upcycled": True, "upcycled-lambda": 1.0, "upcycled-mu": 0.5})


def test_fedprox_theta_m_takes_its_proximal_mu():
    """theta_m = mu/(mu+lambda_m) with the paper's mu, the odd rounds' proximal one: under FedProx upcycled-mu
    must be its prox-mu (it was upcycled-mu, default 0.5, whatever FedProx's mu: another schedule than the
    paper's, silently)."""
    from common.config import ConfigError, validate

    assert validate({"strategy": "fedprox", "prox-mu": 0.1, "upcycled": True, "upcycled-lambda": 0.1,
                     "upcycled-mu": 0.1})
    with pytest.raises(ConfigError, match=r"set upcycled-mu = prox-mu \(0.1\)"):
        validate({"strategy": "fedprox", "prox-mu": 0.1, "upcycled": True, "upcycled-lambda": 0.1})


@pytest.mark.parametrize("config,key", [
    ({"upcycled-lambda": 1.0, "upcycled-theta": 0.7}, "upcycled-theta"),  # theta_m replaces it
    ({"upcycled-lambda-growth": 0.5}, "upcycled-lambda-growth"),  # no lambda, no schedule
    ({"upcycled-mu": 0.9}, "upcycled-mu"),
])
def test_an_upcycled_key_its_schedule_does_not_read_is_refused(config, key):
    from common.config import ConfigError, validate

    with pytest.raises(ConfigError, match=f"{key} = "):
        validate({"strategy": "fedavg", "upcycled": True, **config})
