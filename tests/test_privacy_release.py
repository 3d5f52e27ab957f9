"""What a private client releases: noise and sampling the server cannot regenerate (dp-noise-seed), and
only data-independent metrics in its reply (client/app.py)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from rich.console import Console

import client.app as client_app
import client.node
import client.updates as updates
import common.config as cc
import common.privacy.plan as plan
import server.runner as runner
import server.strategies.registry as registry
from client.app import UnchargedRelease, private_release
from client.privacy import charge
from client.updates.dpsgd import dpsgd_update
from client.updates.hu_dpsgd import hu_update
from client.updates import UnprotectedRecord
from client.updates.perturbation import objective_perturbed, output_perturbed
from common.config import ConfigError, validate
from common.privacy.dpsgd import dpsgd_train
from common.privacy.ledger import PrivacyLedger
from common.records import ARRAYS, CONFIG, METRICS, arrays_to_state_dict, model_to_arrays
from common.seeding import numpy_rng
from server.inprocess import run_inprocess
from server.inprocess_grid import InProcessGrid
from server.strategies.scaffold import Scaffold

DPSGD = {"strategy": "fedavg", "privacy": "dpsgd", "local-steps": 3, "dp-sample-rate": 0.5,
         "dp-noise-multiplier": 1.0, "lr": 0.5, "seed": 7}


def _client(tmp_path, name: str, **config):
    torch.manual_seed(0)
    return SimpleNamespace(config=validate({"results-dir": str(tmp_path), **config}),
                           model=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)),
                           x=torch.randn(20, 4), y=torch.randint(0, 3, (20,)), num_train=20, partition=2,
                           ledger=PrivacyLedger(path=tmp_path / f"{name}.ledger.json"), run_id=0)


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


def _charged(rule):
    """`rule`, charging the node's ledger first, as every private rule must (docs/extending.md)."""
    def run(client, content, state):
        charge(client.ledger, client.config, plan.planned_entries(client.config, content[CONFIG],
                                                                  dataset_size=client.num_train))
        return rule(client, content, state)
    return run


def test_private_reply_carries_no_train_loss(tmp_path):
    client = _client(tmp_path, "a", **DPSGD)
    metrics = private_release(dpsgd_update, client.config)(client, _content(client.model), RecordDict())[METRICS]
    assert "train-loss" not in metrics and set(metrics) == {"num-examples", "dp-steps", "epsilon"}
    output = _client(tmp_path, "a-output", **OUTPUT)
    assert set(private_release(_charged(_with_loss), output.config)(output, _content(output.model),
                                                                     RecordDict())[METRICS]) == {"num-examples", "epsilon"}


def test_non_private_reply_keeps_its_metrics(tmp_path):
    client = _client(tmp_path, "b", strategy="fedavg")
    metrics = private_release(_with_loss, client.config)(client, _content(client.model), RecordDict())[METRICS]
    assert metrics["train-loss"] == 0.7 and metrics["clip-norm-before"] == 4.0


def test_paper_mu_estimator_keeps_its_named_leak(tmp_path):
    from common.privacy.ali import GRAD_DIFF_METRIC

    def rule(client, content, state):
        return RecordDict({METRICS: MetricRecord({"num-examples": 20, "train-loss": 0.7, GRAD_DIFF_METRIC: 1.5})})

    client = _client(tmp_path, "ali", **{**DPSGD, "strategy": "ali-dpfl", "target-epsilon": 20.0,
                                         "local-steps": 0, "ali-mu-estimator": "paper"})
    content = _content(client.model, **{"local-steps": 3})  # ALI-DPFL's server sends tau
    metrics = private_release(_charged(rule), client.config)(client, content, RecordDict())[METRICS]
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


# --- a new privacy mechanism, added as docs/extending.md "A privacy mechanism" says ---------------------
# (from the review of the guide, tests/test_review_extending.py: the registries are monkeypatched for the
# duration of a test, without editing the repository)
QUIET = Console(quiet=True)


def declare_mechanism(monkeypatch, name: str, entry: tuple[str, str], *, wraps: bool,
                      strategies: tuple[str, ...] = (), declare: bool = True) -> None:
    """The guide's steps: the rule registered (PRIVATE_RULES or PRIVATE_WRAPPERS), the name in the privacy
    key's choices, and (unless `declare` is false) declared in common/config.py."""
    monkeypatch.setitem(updates.PRIVATE_WRAPPERS if wraps else updates.PRIVATE_RULES, name, entry)
    privacy = cc.SCHEMA["privacy"]
    monkeypatch.setitem(cc.SCHEMA, "privacy", dataclasses.replace(privacy, choices=privacy.choices + (name,)))
    if declare and wraps:
        monkeypatch.setattr(cc, "PRIVATE_WRAPPER_MECHANISMS", cc.PRIVATE_WRAPPER_MECHANISMS + (name,))
    elif declare:
        monkeypatch.setitem(cc.PRIVATE_RULE_STRATEGIES, name, strategies)


def register_strategy(monkeypatch, name: str, build, rule=("client.updates.sgd", "sgd_update")) -> None:
    """docs/extending.md, "A federated algorithm", steps 2-4, for strategy `name`."""
    monkeypatch.setitem(updates.RULES, name, rule)
    strategies = cc.STRATEGIES + (name,)
    monkeypatch.setattr(cc, "STRATEGIES", strategies)
    monkeypatch.setitem(cc.SCHEMA, "strategy", dataclasses.replace(cc.SCHEMA["strategy"], choices=strategies))
    original = registry.build_base

    def build_base(config, roster, log=print):
        if config["strategy"] == name:
            return build(roster, int(config["seed"]), float(config["fraction-train"]), log)
        return original(config, roster, log)

    monkeypatch.setattr(registry, "build_base", build_base)


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Recorder:
    """Below the strategy: keeps every reply the server receives."""

    def __init__(self, inner):
        self.inner, self.replies = inner, []

    def send_and_receive(self, messages, *, timeout=None):
        out = list(self.inner.send_and_receive(messages, timeout=timeout))
        self.replies += out
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


# replacing the base rule: only for the strategies the mechanism declares

def noisy_sgd_update(client_, content, state):
    """A new mechanism's rule: it replaces the base rule (the guide's PRIVATE_RULES)."""
    from client.updates.sgd import sgd_update

    return sgd_update(client_, content, state)


def test_private_rules_mechanism_does_not_silently_replace_feddyns_rule(monkeypatch):
    """A PRIVATE_RULES entry replaces the base rule: with FedDyn, SCAFFOLD or pFedMe it would drop their
    local correction while their servers aggregate as if the clients had run it. The mechanism declares
    the strategies it implements (common/config.py PRIVATE_RULE_STRATEGIES); validation refuses the rest
    in one line, and `update_rule` too (whoever calls it)."""
    declare_mechanism(monkeypatch, "noisy-sgd", (__name__, "noisy_sgd_update"), wraps=False,
                      strategies=("fedavg", "fedprox"))
    validate({"strategy": "fedprox", "privacy": "noisy-sgd"})
    assert updates.update_rule("fedavg", "noisy-sgd") is noisy_sgd_update
    for strategy in ("feddyn", "scaffold", "pfedme"):
        with pytest.raises(ConfigError, match=f"no local rule of strategy '{strategy}'") as refused:
            validate({"strategy": strategy, "privacy": "noisy-sgd"})
        assert "\n" not in str(refused.value) and "fedavg, fedprox" in str(refused.value)
        with pytest.raises(ValueError, match="its correction would be dropped"):
            updates.update_rule(strategy, "noisy-sgd")


def test_dpsgd_is_refused_with_feddyn_by_its_declaration():
    with pytest.raises(ConfigError, match="privacy = 'dpsgd' replaces the local update rule"):
        validate({**DPSGD, "strategy": "feddyn"})
    with pytest.raises(ValueError, match="its correction would be dropped"):
        updates.update_rule("feddyn", "dpsgd")
    assert updates.update_rule("fedlap", "dpsgd") is updates.update_rule("fedlap")  # its own DP-SGD


@pytest.mark.parametrize("wraps", [False, True], ids=["replaces", "wraps"])
def test_an_undeclared_mechanism_is_refused(monkeypatch, wraps):
    """Registered and in the privacy key's choices, but not declared: which strategies it supports is
    unknown, so it runs with none."""
    declare_mechanism(monkeypatch, "noisy", (__name__, "gauss_wrapped" if wraps else "noisy_sgd_update"),
                      wraps=wraps, declare=False)
    with pytest.raises(ConfigError, match="privacy = 'noisy' is not declared in common/config.py"):
        validate({"privacy": "noisy"})
    with pytest.raises(ValueError, match="PRIVATE_WRAPPER_MECHANISMS" if wraps else "declares it for: none"):
        updates.update_rule("fedavg", "noisy")


def test_a_declared_mechanism_without_a_rule_is_refused(monkeypatch):
    """Declared, never registered: the node must not fall back to the base rule (no mechanism at all)."""
    monkeypatch.setattr(cc, "PRIVATE_WRAPPER_MECHANISMS", cc.PRIVATE_WRAPPER_MECHANISMS + ("ghost",))
    with pytest.raises(ValueError, match="no rule for privacy 'ghost'"):
        updates.update_rule("fedavg", "ghost")


# wrapping the base rule: the reply may hold only what the mechanism protects

def _with_control(client, content, state):  # a SCAFFOLD-like base rule: the model and a control-delta
    reply = _keep_model(client, content, state)
    reply["control-delta"] = ArrayRecord({"c": torch.ones(3)})
    return reply


def _with_config(client, content, state):
    reply = _keep_model(client, content, state)
    reply["extra"] = ConfigRecord({"mean-x": 0.25})
    return reply


@pytest.mark.parametrize("base", [_with_control, _with_config], ids=["array-record", "config-record"])
@pytest.mark.parametrize("mechanism", ["output", "objective"])
def test_a_wrapper_refuses_a_reply_with_a_record_it_does_not_protect(tmp_path, monkeypatch, mechanism, base):
    monkeypatch.setitem(updates.RULES, "with-extra", (__name__, base.__name__))
    if mechanism == "output":
        client = _client(tmp_path, "w", **OUTPUT)
    else:
        client = _client(tmp_path, "w", strategy="fedprox", privacy="objective", model="logreg")
    rule = updates.update_rule("with-extra", mechanism)
    with pytest.raises(UnprotectedRecord, match=f"privacy = '{mechanism}' perturbs only the model"):
        rule(client, _content(client.model), RecordDict())
    # objective perturbation charges before the base runs (an over-count, the safe direction); output
    # perturbation charges after it, before its noise, so nothing is charged for a reply that never left
    assert len(client.ledger) == (1 if mechanism == "objective" else 0)


def test_a_new_wrapper_gets_a_base_rule_that_replies_with_the_model_only(tmp_path, monkeypatch):
    """update_rule hands every PRIVATE_WRAPPERS entry a base rule whose reply is checked: a new wrapper
    (which noises the model only) cannot release a base rule's other record either."""
    declare_mechanism(monkeypatch, "gauss", (__name__, "gauss_wrapped"), wraps=True)
    monkeypatch.setitem(updates.RULES, "fedavg-ctl", (__name__, "_with_control"))
    client = _client(tmp_path, "g", **OUTPUT)
    with pytest.raises(UnprotectedRecord, match=r"privacy = 'gauss' .* also replies with \['control-delta'\]"):
        updates.update_rule("fedavg-ctl", "gauss")(client, _content(client.model), RecordDict())
    reply = updates.update_rule("fedavg", "gauss")(client, _content(client.model), RecordDict())
    assert set(reply) == {ARRAYS, METRICS}


def test_output_perturbation_releases_no_unperturbed_record_of_a_new_strategy(tmp_path, monkeypatch):
    """privacy = 'output' clips and noises `arrays` only. A new strategy registered per the guide whose rule
    also replies with another record (a SCAFFOLD variant's control-delta, a function of the raw data) is
    not known to validation (built-in SCAFFOLD is refused by name), so the wrapper refuses every such
    reply: nothing leaves the nodes, and the run ends with the clients' error."""
    register_strategy(monkeypatch, "scaffold-v2", lambda roster, seed, fraction, log=print:
                      Scaffold(roster, seed, fraction, log), rule=("client.updates.scaffold", "scaffold_update"))
    with pytest.raises(ConfigError, match="SCAFFOLD also sends its control-variate change"):
        validate({"strategy": "scaffold", "privacy": "output"})
    cfg = validate({"strategy": "scaffold-v2", "privacy": "output", "num-rounds": 1,
                    "results-dir": str(tmp_path), "run-name": "out"})
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), 2) as grid:
        recorder = Recorder(grid)
        with pytest.raises(RuntimeError, match=r"clients failed: .*\['control-delta'\]"):
            runner.run_federation(recorder, cfg, QUIET)
    train = [r for r in recorder.replies if r.metadata.message_type == "train"]
    assert len(train) == 2 and all(r.has_error() for r in train)


# who charges the node's ledger: the rule, or nothing is released

def gauss_wrapped(base):
    """A new mechanism written from the guide: a PRIVATE_WRAPPERS entry that noises the reply's model;
    its events are returned by planned_entries (patched below), "both sides call one function"."""
    def rule(client_, content, state):
        reply = base(client_, content, state)
        noisy = {k: v + torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) if v.is_floating_point()
                 else v for k, v in arrays_to_state_dict(reply[ARRAYS]).items()}
        reply[ARRAYS] = ArrayRecord(noisy)
        return reply

    return rule


def charged_gauss_wrapped(base):
    """gauss_wrapped, charging the node's ledger before the base rule touches the data (the guide)."""
    noised = gauss_wrapped(base)

    def rule(client_, content, state):
        config = client_.config
        charge(client_.ledger, config, plan.planned_entries(config, content[CONFIG], dataset_size=client_.num_train))
        return noised(client_, content, state)

    return rule


def gauss_run(tmp_path, monkeypatch, wrapper: str, run_name: str, **extra):
    """A run with the mechanism 'gauss' (wrapper `wrapper`): accounted as the same Gaussian release as
    'output', on both sides (planned_entries, imported by name by the runner and the ClientApp)."""
    declare_mechanism(monkeypatch, "gauss", (__name__, wrapper), wraps=True)
    original = plan.planned_entries

    def planned_entries(config, instruction, dataset_size=None):
        if config["privacy"] == "gauss":
            return original({**dict(config), "privacy": "output"}, instruction, dataset_size)
        return original(config, instruction, dataset_size)

    for module in (plan, runner, client_app):
        monkeypatch.setattr(module, "planned_entries", planned_entries)
    client.node._local.clear()
    cfg = validate({"privacy": "gauss", "target-epsilon": 400.0, "num-rounds": 3, "results-dir": str(tmp_path),
                    "run-name": run_name, **extra})
    return run_inprocess(cfg, console=QUIET)


def test_a_new_wrapper_mechanism_is_charged_on_the_client_and_held_to_the_budget(tmp_path, monkeypatch):
    """The server's mirror charges planned_entries by itself; the node's ledger only if the rule calls
    client.privacy.charge. A mechanism that does not (here: the guide followed without step 2) would be
    released uncharged, never refused, past target-epsilon (771 against 400 after 3 rounds): private_release
    refuses its every reply instead, and the run ends with that error."""
    with pytest.raises(RuntimeError, match=r"no round updated the model; clients failed: .*gauss_wrapped"
                                           r".*replied without charging this node's privacy ledger"
                                           r".*client\.privacy\.charge\(client\.ledger"):
        gauss_run(tmp_path, monkeypatch, "gauss_wrapped", "uncharged")


def test_a_new_wrapper_mechanism_that_charges_is_held_to_the_budget(tmp_path, monkeypatch):
    out = gauss_run(tmp_path, monkeypatch, "charged_gauss_wrapped", "charged")
    spent = [r["epsilon_max"] for r in rows(out)]
    assert spent[-1] <= 400.0, f"epsilon per round {spent} passed target-epsilon 400 without a refusal"
    assert spent[0] > 0 and len(set(spent)) < len(spent)  # charged, then refused once it would pass 400


def test_private_release_refuses_an_uncharged_reply_and_names_the_rule(tmp_path):
    client = _client(tmp_path, "u", **OUTPUT)
    with pytest.raises(UnchargedRelease, match=r"_keep_model \(privacy 'output', strategy 'fedavg'\)"):
        private_release(_keep_model, client.config)(client, _content(client.model), RecordDict())
    assert len(client.ledger) == 0
    plain = _client(tmp_path, "p", strategy="fedavg")  # a non-private run charges nothing
    assert ARRAYS in private_release(_keep_model, plain.config)(plain, _content(plain.model), RecordDict())


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_an_accountant_that_cannot_compose_a_new_mechanism_is_refused_before_anything_leaves(tmp_path, monkeypatch):
    """Which accountant composes which mechanism is checked by name (common/config.py _check_accountant). A new
    Gaussian mechanism with accountant = 'ali-eq12' (DP-SGD entries only) validated; its clients released round
    1's model, then the server's mirror died ("covers dpsgd entries only; the ledger also holds gaussian")."""
    with pytest.raises(ConfigError, match="accountant = 'ali-eq12' cannot account this run's releases: .*gaussian"):
        gauss_run(tmp_path, monkeypatch, "charged_gauss_wrapped", "acc", accountant="ali-eq12")
    assert all(not PrivacyLedger.load(path).entries for path in tmp_path.rglob("*.ledger.json"))
