"""The base algorithms: each runs on the in-process engine (vanilla and
Upcycled) and improves on the initial model; their client rules keep and
update their state as specified."""

import io
import json
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from rich.console import Console

from client.node import LocalClient
from client.updates import RULES, update_rule
from client.updates.feddyn import STATE_KEY as FEDDYN_STATE
from client.updates.pfedme import STATE_KEY as PFEDME_STATE
from client.updates.scaffold import CONTROL, CONTROL_DELTA, STATE_KEY as SCAFFOLD_STATE
from common.config import STRATEGIES, validate
from common.records import ARRAYS, CONFIG, METRICS, arrays_to_state_dict, model_to_arrays
from server.inprocess import run_inprocess

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
