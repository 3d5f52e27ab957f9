"""The base algorithms: each runs on the in-process engine (vanilla and
Upcycled) and improves on the initial model; their client rules keep and
update their state as specified."""

import io
import json
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from rich.console import Console

from client.node import LocalClient
from client.updates import RULES, update_rule
from client.updates.feddyn import STATE_KEY as FEDDYN_STATE
from client.updates.pfedme import STATE_KEY as PFEDME_STATE
from client.updates.scaffold import CONTROL, CONTROL_DELTA, STATE_KEY as SCAFFOLD_STATE
from common.config import STRATEGIES, validate
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, arrays_to_state_dict, model_to_arrays
from server.inprocess import run_inprocess
from server.roster import Roster

RUN = {"num-clients": 6, "fraction-train": 0.5, "local-epochs": 1, "stragglers": 0.5, "seed": 2,
       "dataset": "synthetic", "momentum": 0.5, "num-rounds": 4}
BASES = ("fedavg", "fedavgm", "fedprox", "scaffold", "feddyn", "pfedme", "fedyogi")  # Upcycled-FL's bases
LR = {"pfedme": 0.01}  # lambda * lr must stay below 1 for pFedMe's local-model step


def run(tmp_path, **overrides):
    out = run_inprocess(validate({**RUN, "results-dir": str(tmp_path), **overrides}),
                        console=Console(file=io.StringIO()))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, json.loads((out / "summary.json").read_text())


def test_every_base_is_a_strategy_with_a_client_rule():
    assert set(BASES) <= set(STRATEGIES) and set(BASES) <= set(RULES)
    for name in BASES:
        assert callable(update_rule(name))


@pytest.mark.parametrize("upcycled", [False, True], ids=["vanilla", "upcycled"])
@pytest.mark.parametrize("strategy", BASES)
def test_base_runs_and_improves(tmp_path, strategy, upcycled):
    rows, summary = run(tmp_path, strategy=strategy, upcycled=upcycled, lr=LR.get(strategy, 0.1),
                        **{"run-name": f"{strategy}-{upcycled}"})
    assert summary["final"]["accuracy"] > summary["initial"]["accuracy"] + 0.15
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert [r["clients"] for r in rows] == ([3, 0, 3, 0] if upcycled else [3, 3, 3, 3])


# --- client rules ------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    return LocalClient(validate({**RUN, "lr": 0.05, "local-epochs": 1}), 1)


def instruction(client, server_round=1, train_round=None, **extra):
    torch.manual_seed(0)
    for p in client.model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    config = {"server-round": server_round, **extra}
    if train_round is not None:
        config["train-round"] = train_round
    return model_to_arrays(client.model), ConfigRecord(config)


def test_local_training_is_keyed_on_the_training_round(client):
    outs = []
    for server_round, train_round in ((1, 1), (3, 1), (3, 2)):
        arrays, config = instruction(client, server_round, train_round)
        reply = update_rule("fedavg")(client, RecordDict({ARRAYS: arrays, CONFIG: config}), RecordDict())
        outs.append(np.concatenate([a.numpy().ravel() for a in reply[ARRAYS].values()]))
    np.testing.assert_array_equal(outs[0], outs[1])  # server rounds 1 and 3, both training round 1
    assert not np.array_equal(outs[0], outs[2])


def test_fedprox_mu_zero_is_fedavg_and_mu_pulls_towards_the_global(client):
    drift, ends = {}, {}
    for mu in (0.0, 10.0):
        arrays, config = instruction(client, **{"proximal-mu": mu})
        start = arrays_to_state_dict(arrays)
        reply = update_rule("fedprox")(client, RecordDict({ARRAYS: arrays, CONFIG: config}), RecordDict())
        ends[mu] = arrays_to_state_dict(reply[ARRAYS])
        drift[mu] = sum(float((ends[mu][k] - start[k]).norm()) for k in start)
    assert drift[10.0] < 0.8 * drift[0.0]
    arrays, config = instruction(client)
    plain = arrays_to_state_dict(update_rule("fedavg")(client, RecordDict({ARRAYS: arrays, CONFIG: config}),
                                                       RecordDict())[ARRAYS])
    for k in plain:
        torch.testing.assert_close(ends[0.0][k], plain[k], rtol=0, atol=0)


def test_scaffold_client_keeps_its_control_variate(client):
    arrays, config = instruction(client)
    zeros = ArrayRecord(OrderedDict((k, torch.zeros_like(v)) for k, v in arrays_to_state_dict(arrays).items()))
    state = RecordDict()
    reply = update_rule("scaffold")(client, RecordDict({ARRAYS: arrays, CONTROL: zeros, CONFIG: config}), state)
    x, y = arrays_to_state_dict(arrays), arrays_to_state_dict(reply[ARRAYS])
    steps = -(-client.num_train // 32)  # one epoch of ceil(n / 32) minibatches
    delta = arrays_to_state_dict(reply[CONTROL_DELTA])
    for k in x:  # c = c_i = 0: c_i+ = (x - y) / (K lr), delta c_i = c_i+
        torch.testing.assert_close(delta[k], (x[k] - y[k]) / (steps * 0.05), rtol=1e-4, atol=1e-6)
    stored = arrays_to_state_dict(state[SCAFFOLD_STATE])
    for k in x:
        torch.testing.assert_close(stored[k], delta[k])
    # second round: c_i comes from the state; delta = c_i+ - c_i
    c_i = arrays_to_state_dict(state[SCAFFOLD_STATE])
    reply2 = update_rule("scaffold")(client, RecordDict({ARRAYS: arrays, CONTROL: zeros, CONFIG: config}), state)
    c_plus = arrays_to_state_dict(state[SCAFFOLD_STATE])
    for k in c_i:
        torch.testing.assert_close(arrays_to_state_dict(reply2[CONTROL_DELTA])[k], c_plus[k] - c_i[k])


def test_feddyn_client_updates_its_gradient_state(client):
    arrays, config = instruction(client)
    state = RecordDict()
    reply = update_rule("feddyn")(client, RecordDict({ARRAYS: arrays, CONFIG: config}), state)
    x, w = arrays_to_state_dict(arrays), arrays_to_state_dict(reply[ARRAYS])
    g = arrays_to_state_dict(state[FEDDYN_STATE])
    for k in x:  # g_i = 0 - alpha (w_i - x)
        torch.testing.assert_close(g[k], -0.01 * (w[k] - x[k]))


def test_pfedme_keeps_the_personal_model_and_reports_its_accuracy(client):
    arrays, config = instruction(client)
    state = RecordDict()
    c = LocalClient(validate({**RUN, "lr": 0.01, "local-epochs": 1}), 1)
    reply = update_rule("pfedme")(c, RecordDict({ARRAYS: arrays, CONFIG: config}), state)
    metrics = reply[METRICS]
    assert 0.0 <= metrics["personal-accuracy"] <= 1.0  # weighted by the test sizes the server loads itself
    personal, local = arrays_to_state_dict(state[PFEDME_STATE]), arrays_to_state_dict(reply[ARRAYS])
    assert any(not torch.equal(personal[k], local[k]) for k in personal)


def test_pfedme_personal_step_is_the_papers_update():
    from client.updates.pfedme import personal_step

    gen = torch.Generator().manual_seed(0)
    thetas = [torch.randn(3, 4, generator=gen), torch.randn(4, generator=gen)]
    ws = [torch.randn(3, 4, generator=gen), torch.randn(4, generator=gen)]
    grads = [torch.randn(3, 4, generator=gen), None]  # a parameter without gradient still gets the prox terms
    lr, lam, mu = 0.05, 15.0, 1e-3
    expected = [t - lr * ((g if g is not None else 0) + lam * (t - w) + mu * t) for t, w, g in zip(thetas, ws, grads)]
    personal_step(thetas, grads, ws, lr, lam, mu)
    for got, want in zip(thetas, expected):
        torch.testing.assert_close(got, want)


def test_building_a_strategy_logs_no_flower_warning_about_federated_evaluation():
    """Every strategy sets fraction_evaluate = 0 (the runner evaluates centrally); Flower's warning about it
    would print on every run, --quiet included."""
    import logging

    from common.config import validate
    from server.roster import Roster
    from server.strategies.registry import build_strategy

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    try:
        for strategy in ("fedavg", "fedavgm", "fedprox", "scaffold", "feddyn", "pfedme", "fedyogi"):
            build_strategy(validate({"strategy": strategy}), Roster({0: 10, 1: 11}, {0: 50, 1: 50}),
                           log=lambda _: None)
    finally:
        flwr_logger.removeHandler(handler)
    assert not [r for r in records if "fraction_evaluate" in r.getMessage()]


# --- the servers' math by hand (review of session 19) ---------------------------------------------------
ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})


@pytest.fixture()
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1


def _record(values) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.asarray(values, np.float32))})


def _round(strategy, server_round: int, x: ArrayRecord):
    """Client p (0, 1, 2) replies x + (p + 1) * (1, -2); weights 10, 30, 60 examples."""
    partition_of = {v: k for k, v in ROSTER.node_of.items()}
    replies = []
    for msg in strategy.configure_train(server_round, x, ConfigRecord(), None):
        p = partition_of[msg.metadata.dst_node_id]
        w = x["w"].numpy() + (p + 1) * np.array([1.0, -2.0], np.float32)
        replies.append(Message(RecordDict({ARRAYS: _record(w), METRICS: MetricRecord(
            {NUM_EXAMPLES: ROSTER.num_examples[p]})}), reply_to=msg))
    new, _ = strategy.aggregate_train(server_round, replies)
    return new


# --- (review of session 19) the servers' updates, derived by hand, through Upcycled's even rounds ---------------
def test_server_updates_match_hand_derivations_through_upcycled_rounds(task_identity):
    """p-weighted mean delta = 2.5 (1, -2) (weights .1/.3/.6), unweighted = 2 (1, -2). FedAvgM (beta 0.3,
    Nesterov): step = g + beta buf; FedYogi from v0 = 0; FedDyn (alpha 0.1, N = 3) with h; even rounds
    extrapolate with theta 0.5 and leave momentum / m, v / h alone (round 3 steps from the extrapolated
    model with the round-1 state)."""
    from server.strategies.fedavgm import FedAvgM
    from server.strategies.feddyn import FedDyn
    from server.strategies.fedyogi import FedYogi
    from server.strategies.upcycled import Upcycled

    quiet = lambda _: None  # noqa: E731
    # FedAvgM: g = x - avg = (-2.5, 5); round 1: x - 1.3 g; round 3: x - (1 + 0.3 * 1.3) g
    s = Upcycled(FedAvgM(ROSTER, 1, 1.0, log=quiet, server_momentum=0.3), 0.5, log=quiet)
    x0 = _record([0.0, 1.0])
    x1 = _round(s, 1, x0)
    np.testing.assert_allclose(x1["w"].numpy(), [3.25, -5.5], rtol=1e-6)
    x2 = _round(s, 2, x1)
    np.testing.assert_allclose(x2["w"].numpy(), [4.875, -8.75], rtol=1e-6)
    x3 = _round(s, 3, x2)
    np.testing.assert_allclose(x3["w"].numpy(), [4.875 + 1.39 * 2.5, -8.75 - 1.39 * 5], rtol=1e-6)
    # FedYogi: Delta = (2.5, -5); m = 0.1 Delta; v = 0.01 Delta^2; x += 0.1 m / (sqrt v + 1e-3)
    s = Upcycled(FedYogi(ROSTER, 1, 1.0, log=quiet), 0.5, log=quiet)
    x1 = _round(s, 1, x0)
    np.testing.assert_allclose(x1["w"].numpy(), [0.1 * 0.25 / 0.251, 1 - 0.1 * 0.5 / 0.501], rtol=1e-5)
    x2 = _round(s, 2, x1)
    x3 = _round(s, 3, x2)  # m = 0.475 (1, -2), v = 0.125 (1, 4) after round 3
    step = 0.1 * 0.475 * np.array([1.0, -2.0]) / (np.sqrt(0.125 * np.array([1.0, 4.0])) + 1e-3)
    np.testing.assert_allclose(x3["w"].numpy() - x2["w"].numpy(), step, rtol=1e-5)
    # FedDyn: mean w = x + 2 (1, -2); h -= alpha (1/N) sum (w_i - x); x = mean - h / alpha
    s = Upcycled(FedDyn(ROSTER, 1, 1.0, log=quiet, alpha=0.1), 0.5, log=quiet)
    x1 = _round(s, 1, x0)
    np.testing.assert_allclose(x1["w"].numpy(), [4.0, -7.0], rtol=1e-6)
    x2 = _round(s, 2, x1)
    np.testing.assert_allclose(x2["w"].numpy(), [6.0, -11.0], rtol=1e-6)
    x3 = _round(s, 3, x2)  # h = -0.4 (1, -2): x = (8, -15) + 4 (1, -2)
    np.testing.assert_allclose(x3["w"].numpy(), [12.0, -23.0], rtol=1e-6)


# --- (review of session 19) server state = mean of the clients' states under partial participation + stragglers -
@pytest.mark.parametrize("strategy", ["scaffold", "feddyn"])
def test_server_state_is_the_mean_of_client_states_with_stragglers(strategy, tmp_path, monkeypatch):
    """SCAFFOLD's c = (1/N) sum_i c_i and FedDyn's h = (1/N) sum_i g_i (all N clients, never-sampled ones
    at 0) hold after 6 rounds of 3 of 5 clients with 50 % stragglers of 1-2 of 3 epochs and momentum."""
    from client.updates.acknowledged import settled
    from client.updates.feddyn import STATE_KEY as FEDDYN_STATE
    from client.updates.scaffold import STATE_KEY as SCAFFOLD_STATE
    from server import runner
    from server.inprocess import CLIENT_APP, quiet_flower
    from server.inprocess_grid import InProcessGrid

    torch.set_num_threads(1)
    cfg = validate({"num-clients": 5, "fraction-train": 0.6, "local-epochs": 3, "stragglers": 0.5, "seed": 4,
                    "dataset": "synthetic", "momentum": 0.5, "num-rounds": 6, "lr": 0.05, "strategy": strategy,
                    "results-dir": str(tmp_path)})
    captured = {}
    build = runner.build_strategy
    monkeypatch.setattr(runner, "build_strategy",
                        lambda *a, **k: captured.setdefault("s", build(*a, **k)))
    with quiet_flower(), InProcessGrid(CLIENT_APP, dict(cfg), 5) as grid:
        runner.run_federation(grid, cfg, Console(file=io.StringIO()))
        server = captured["s"]
        key = SCAFFOLD_STATE if strategy == "scaffold" else FEDDYN_STATE
        states = []
        for ctx in grid.contexts.values():
            p = int(ctx.node_config["partition-id"])
            stored = settled(ctx.state, key, {"acknowledged-round": server.acknowledged.get(p, 0)})
            states.append(None if stored is None else arrays_to_state_dict(stored))
    held = server.control if strategy == "scaffold" else server.h
    assert any(np.abs(v).max() > 1e-4 for v in held.values())
    for name, value in held.items():
        mean = sum(s[name].numpy() for s in states if s is not None) / 5
        np.testing.assert_allclose(value, mean, atol=1e-6)


# --- defect: a pFedMe run whose local steps provably diverge is accepted ------------------------------
