"""What a private client releases: noise and sampling the server cannot regenerate (dp-noise-seed), and
only data-independent metrics in its reply (client/app.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from client.app import private_release
from client.updates.dpsgd import dpsgd_update
from client.updates.hu_dpsgd import hu_update
from client.updates.perturbation import objective_perturbed, output_perturbed
from common.config import ConfigError, validate
from common.privacy.dpsgd import dpsgd_train
from common.privacy.ledger import PrivacyLedger
from common.records import ARRAYS, METRICS, model_to_arrays
from common.seeding import numpy_rng

DPSGD = {"strategy": "fedavg", "privacy": "dpsgd", "local-steps": 3, "dp-sample-rate": 0.5,
         "dp-noise-multiplier": 1.0, "lr": 0.5, "seed": 7}


def _client(tmp_path, name: str, **config):
    torch.manual_seed(0)
    return SimpleNamespace(config=validate({"results-dir": str(tmp_path), **config}),
                           model=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)),
                           x=torch.randn(20, 4), y=torch.randint(0, 3, (20,)), num_train=20, partition=2,
                           ledger=PrivacyLedger(path=tmp_path / f"{name}.ledger.json"))


def _content(model, **instruction) -> RecordDict:
    return RecordDict({ARRAYS: model_to_arrays(model), "config": ConfigRecord({"server-round": 4, **instruction})})


def _released(tmp_path, rule, config: dict, name: str, **instruction) -> torch.Tensor:
    """The flattened model a fresh client (same data, same start model) releases for one instruction."""
    client = _client(tmp_path, name, **config)
    reply = rule(client, _content(client.model, **instruction), RecordDict())
    return torch.cat([torch.as_tensor(a.numpy()).reshape(-1) for a in reply[ARRAYS].values()])


HU = {"strategy": "dpfedavg-hu", "num-clients": 4, "batch-size": 4, "hu-local-steps": 3}
HU_INSTRUCTION = {"hu-sigma": 0.5, "hu-local-steps": 3, "hu-clip": 1.0, "hu-accountant": "conservative"}
OUTPUT = {"strategy": "fedavg", "privacy": "output", "output-noise-std": 0.1}


def _keep_model(client, content, state):  # a base rule that releases the received model
    return RecordDict({ARRAYS: content[ARRAYS], METRICS: MetricRecord({"num-examples": client.num_train})})


@pytest.mark.parametrize("rule, config, instruction", [
    (dpsgd_update, DPSGD, {}),
    (hu_update, HU, HU_INSTRUCTION),
    (output_perturbed(_keep_model), OUTPUT, {}),
], ids=["dpsgd", "hu", "output"])
def test_secret_noise_differs_between_runs_and_run_seed_noise_repeats(tmp_path, rule, config, instruction):
    secret = [_released(tmp_path, rule, config, f"s{i}", **instruction) for i in range(2)]
    assert not torch.equal(*secret)  # the default: fresh OS randomness per client and round
    repeat = [_released(tmp_path, rule, {**config, "dp-noise-seed": "run-seed"}, f"r{i}", **instruction)
              for i in range(2)]
    assert torch.equal(*repeat)


def test_objective_noise_is_secret_by_default(tmp_path):
    def noise_norm(mode: str, name: str) -> float:
        client = _client(tmp_path, name, strategy="fedprox", privacy="objective", model="logreg",
                         **{"dp-noise-seed": mode})
        reply = objective_perturbed(_keep_model)(client, _content(client.model), RecordDict())
        return reply[METRICS]["objective-noise-norm"]

    assert noise_norm("secret", "s0") != noise_norm("secret", "s1")
    assert noise_norm("run-seed", "r0") == noise_norm("run-seed", "r1")


def _rebuilt_by_server(tmp_path, client) -> torch.Tensor:
    """The reviewer's attack: regenerate the client's DP-SGD seed from the public run config and redo its
    steps (here even on its data, the strongest case): with run-seed noise that rebuilds the release."""
    seed = int(numpy_rng(int(client.config["seed"]), "client-dpsgd", client.partition, 4).integers(2**62))
    model = _client(tmp_path, "rebuild", **DPSGD).model  # the same start model
    dpsgd_train(model, client.x, client.y, steps=3, sample_rate=0.5, max_grad_norm=1.0, noise_multiplier=1.0,
                lr=0.5, seed=seed)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("mode, rebuilt", [("run-seed", True), ("secret", False)])
def test_server_cannot_rebuild_secret_noise_from_the_config(tmp_path, mode, rebuilt):
    client = _client(tmp_path, "victim", **{**DPSGD, "dp-noise-seed": mode})
    reply = dpsgd_update(client, _content(client.model), RecordDict())
    released = torch.cat([torch.as_tensor(a.numpy()).reshape(-1) for a in reply[ARRAYS].values()])
    assert torch.equal(released, _rebuilt_by_server(tmp_path, client)) is rebuilt


def test_dp_noise_seed_is_checked():
    with pytest.raises(ConfigError, match="dp-noise-seed"):
        validate({"dp-noise-seed": "public"})


def test_summary_and_console_say_how_the_noise_was_seeded():
    from server.privacy_mirror import PrivacyMirror
    from server.strategies.registry import note_noise_seed

    config = validate({**DPSGD, "dp-noise-seed": "run-seed"})
    assert PrivacyMirror(config, [0, 1]).summary()["noise_seed"] == "run-seed"
    assert PrivacyMirror(validate(DPSGD), [0]).summary()["noise_seed"] == "secret"
    assert PrivacyMirror(validate({}), [0]).summary() == {"mechanism": "none"}
    lines = []
    note_noise_seed(config, lines.append)
    note_noise_seed(validate(DPSGD), lines.append)  # secret: nothing to warn about
    assert len(lines) == 1 and "run-seed" in lines[0]


def test_runs_from_before_the_key_are_not_stale():
    """A finished private run whose summary predates dp-noise-seed drew run-seed noise; a non-private one none."""
    from server.report import _same_run

    private = {k: v for k, v in validate(DPSGD).items() if k != "dp-noise-seed"}
    assert _same_run(private, {**private, "dp-noise-seed": "run-seed"})
    assert not _same_run(private, {**private, "dp-noise-seed": "secret"})
    plain = {k: v for k, v in validate({}).items() if k != "dp-noise-seed"}
    assert _same_run(plain, {**plain, "dp-noise-seed": "secret"})


def test_a_new_default_of_a_key_the_run_never_used_leaves_it_finished():
    """output-sensitivity's default changed (paper -> ball): a finished non-output run is not redone, an
    output-perturbation run is."""
    from server.report import _same_run

    plain = dict(validate({}))
    assert _same_run({**plain, "output-sensitivity": "paper"}, plain)
    output = dict(validate(OUTPUT))
    assert not _same_run({**output, "output-sensitivity": "paper"}, {**output, "output-sensitivity": "ball"})


# --- item: only data-independent metrics leave a private client -----------------------------------
def _with_loss(client, content, state):
    return RecordDict({ARRAYS: content[ARRAYS], METRICS: MetricRecord(
        {"num-examples": 20, "train-loss": 0.7, "epsilon": 0.3, "clip-norm-before": 4.0})})


def test_private_reply_carries_no_train_loss(tmp_path):
    client = _client(tmp_path, "a", **DPSGD)
    metrics = private_release(dpsgd_update, client.config)(client, _content(client.model), RecordDict())[METRICS]
    assert "train-loss" not in metrics and set(metrics) == {"num-examples", "dp-steps", "epsilon"}
    output = validate(OUTPUT)
    assert set(private_release(_with_loss, output)(client, _content(client.model), RecordDict())[METRICS]) == {
        "num-examples", "epsilon"}


def test_non_private_reply_keeps_its_metrics(tmp_path):
    client = _client(tmp_path, "b", strategy="fedavg")
    metrics = private_release(_with_loss, client.config)(client, _content(client.model), RecordDict())[METRICS]
    assert metrics["train-loss"] == 0.7 and metrics["clip-norm-before"] == 4.0


def test_paper_mu_estimator_keeps_its_named_leak(tmp_path):
    from common.privacy.ali import GRAD_DIFF_METRIC

    def rule(client, content, state):
        return RecordDict({METRICS: MetricRecord({"num-examples": 20, "train-loss": 0.7, GRAD_DIFF_METRIC: 1.5})})

    config = validate({**DPSGD, "strategy": "ali-dpfl", "target-epsilon": 2.0, "ali-mu-estimator": "paper"})
    metrics = private_release(rule, config)(None, RecordDict(), RecordDict())[METRICS]
    assert set(metrics) == {"num-examples", GRAD_DIFF_METRIC}  # the server's mu estimate needs it (warned)


def test_private_run_reports_no_train_loss(tmp_path):
    """Through the ClientApp (the in-process engine): the server's rows carry no train loss."""
    from server.inprocess import run_inprocess

    config = validate({**DPSGD, "dataset": "synthetic", "num-clients": 2, "num-rounds": 1, "local-steps": 1,
                       "dp-sample-rate": 0.1, "results-dir": str(tmp_path), "run-name": "p"})
    rows = [json.loads(x) for x in (run_inprocess(config) / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train_loss"] is None and rows[0]["epsilon_max"] > 0


def test_dpsgd_without_noise_is_refused():
    with pytest.raises(ConfigError, match="dp-noise-multiplier = 0"):
        validate({**DPSGD, "dp-noise-multiplier": 0.0})
