"""DP-FedAvg of Hu et al. (client/updates/hu_dpsgd.py, server/strategies/dpfedavg_hu.py): the local
step, the noise convention, the zCDP accountants, sigma calibration, budgets, and a run with secure
aggregation."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from client.privacy import BudgetExhausted
from client.updates.hu_dpsgd import (
    calibrate_sigma,
    epoch_batches,
    epochs_touched,
    hu_train,
    hu_update,
    rho_coefficient,
    round_rho,
)
from common.config import ConfigError, validate
from common.privacy.accounting import hu_rho, zcdp_epsilon, zcdp_rho_for_epsilon
from common.privacy.ledger import PrivacyLedger
from common.records import model_to_arrays
from server.inprocess import run_inprocess
from server.roster import Roster
from server.strategies.dpfedavg_hu import DpFedAvgHu, participation_schedule


def test_batches_are_disjoint_within_an_epoch():
    g = torch.Generator().manual_seed(0)
    stream = epoch_batches(10, 3, g)
    first = [next(stream) for _ in range(3)]  # floor(10/3) = 3 batches per epoch
    assert all(len(b) == 3 for b in first)
    assert len(set(torch.cat(first).tolist())) == 9
    assert epochs_touched(10, 2442, 1221) == 5 and epochs_touched(2, 2442, 64) == 1
    with pytest.raises(ValueError):
        epochs_touched(1, 10, 11)


def test_one_step_is_the_papers_clipped_mean_gradient():
    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randint(0, 2, (8,))
    model = torch.nn.Linear(5, 2)
    start = [p.detach().clone() for p in model.parameters()]
    G, eta = 0.05, 0.7
    # the expected step: (1/gamma) sum_i clip_G(grad_i), every per-sample gradient clipped jointly
    grads = []
    for i in range(8):
        ref = torch.nn.Linear(5, 2)
        ref.load_state_dict(model.state_dict())
        loss = torch.nn.functional.cross_entropy(ref(x[i:i + 1]), y[i:i + 1])
        g = torch.autograd.grad(loss, list(ref.parameters()))
        norm = torch.sqrt(sum((t ** 2).sum() for t in g))
        grads.append([t * min(1.0, G / float(norm)) for t in g])
    mean = [sum(gs[k] for gs in grads) / 8 for k in range(2)]
    gen = torch.Generator().manual_seed(1)
    hu_train(model, x, y, steps=1, batch_size=8, clip=G, sigma=0.0, lr=eta, generator=gen)
    for p, s0, m in zip(model.parameters(), start, mean):
        torch.testing.assert_close(p.detach(), s0 - eta * m, rtol=1e-5, atol=1e-6)


def test_noise_has_std_sigma_on_the_averaged_gradient():
    """Opacus adds N(0, (z G)^2) to the sum and divides by gamma; z = sigma gamma / G gives std sigma."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 2000), torch.randint(0, 2, (64,))
    model = torch.nn.Linear(2000, 2)
    start = torch.cat([p.detach().ravel().clone() for p in model.parameters()])
    sigma, eta, G = 0.3, 1.0, 1e-9  # the clipped gradient is negligible: the step is -eta * b
    hu_train(model, x, y, steps=1, batch_size=32, clip=G, sigma=sigma, lr=eta,
             generator=torch.Generator().manual_seed(2), noise_generator=torch.Generator().manual_seed(3))
    step = torch.cat([p.detach().ravel() for p in model.parameters()]) - start
    assert float(step.std()) == pytest.approx(eta * sigma, rel=0.05)
    assert abs(float(step.mean())) < 0.05 * sigma


def test_accountants():
    kw = dict(local_steps=10, clip=1.0, dataset_size=2442, batch_size=1221)
    # paper: Theorem 1 per participation, the common formula
    assert round_rho("paper", 0.5, **kw, clients_per_round=10) == pytest.approx(
        hu_rho(1, 10, 1.0, 2442, 1221, 0.5, clients_per_round=10))
    # conservative = paper without the /r credit when m/gamma divides tau ...
    assert round_rho("conservative", 0.5, **kw) == pytest.approx(round_rho("paper", 0.5, **kw, clients_per_round=1))
    # ... and never below one step when tau * gamma < m (the paper's formula undercounts there)
    small = dict(local_steps=2, clip=1.0, dataset_size=2442, batch_size=64)
    one_step = 2 * 1.0 / (64 ** 2 * 0.5 ** 2)
    assert round_rho("conservative", 0.5, **small) == pytest.approx(one_step)
    assert round_rho("paper", 0.5, **small) < one_step
    # DP-DSGD literal: 2 G^2 / (n gamma^2 sigma^2)
    assert round_rho("paper-dsgd", 0.5, local_steps=1, clip=2.0, dataset_size=2442, batch_size=100,
                     num_clients=16) == pytest.approx(2 * 4 / (16 * 100 ** 2 * 0.25))
    with pytest.raises(ValueError):
        rho_coefficient("bogus", **kw)


@pytest.mark.parametrize("accountant", ["conservative", "paper", "paper-dsgd"])
@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_calibrated_sigma_spends_exactly_the_budget(accountant, epsilon):
    kw = dict(local_steps=1 if accountant == "paper-dsgd" else 10, clip=1.0, dataset_size=2442, batch_size=1221,
              clients_per_round=10, num_clients=16)
    sigma = calibrate_sigma(accountant, epsilon, 1e-4, 14, **kw)
    assert zcdp_epsilon(14 * round_rho(accountant, sigma, **kw), 1e-4) == pytest.approx(epsilon, rel=1e-9)
    # the digest's rho*(epsilon) for delta = 1e-4
    assert zcdp_rho_for_epsilon(epsilon, 1e-4) == pytest.approx({1.0: 0.025763, 10.0: 1.817390}[epsilon], abs=2e-6)


def _roster(n=16, m=2442):
    return Roster({p: 1000 + p for p in range(n)}, {p: m for p in range(n)})


def _hu_config(**kw):
    return validate({"strategy": "dpfedavg-hu", "num-clients": 16, "fraction-train": 0.625, "num-rounds": 20,
                     "batch-size": 1221, "hu-local-steps": 10, "target-epsilon": 10.0, "target-delta": 1e-4, **kw})


def test_strategy_calibrates_sigma_over_the_drawn_schedule():
    config = _hu_config(**{"hu-accountant": "paper", "secure-aggregation": True, "secagg-min-survivors": 10})
    s = DpFedAvgHu(_roster(), 0, 0.625, lambda _: None, config=config)
    schedule = participation_schedule(0, 20, list(range(16)), 0.625)
    assert s.r == 10 and sum(schedule.values()) == 200 and s.schedule == schedule
    assert s.planned_epsilon() == pytest.approx(10.0, rel=1e-9)
    # the secure-aggregation credit: sigma^2 is r times smaller than without secure aggregation
    plain = DpFedAvgHu(_roster(), 0, 0.625, lambda _: None, config=_hu_config(**{"hu-accountant": "paper"}))
    assert plain.sigma / s.sigma == pytest.approx(math.sqrt(10))
    # ... but only for the clients surely in the decoded sum: a round may decode min-survivors of them
    few = DpFedAvgHu(_roster(), 0, 0.625, lambda _: None,
                     config=_hu_config(**{"hu-accountant": "paper", "secure-aggregation": True}))
    assert few.credited == 2 and plain.sigma / few.sigma == pytest.approx(math.sqrt(2))
    cons = DpFedAvgHu(_roster(), 0, 0.625, lambda _: None, config=_hu_config(**{"secure-aggregation": True}))
    assert cons.sigma == pytest.approx(plain.sigma)  # conservative: no credit, whole epochs here
    cfg = s.round_config(1, ConfigRecord())
    assert cfg["hu-sigma"] == s.sigma and cfg["hu-local-steps"] == 10 and cfg["hu-accountant"] == "paper"


def test_config_checks():
    with pytest.raises(ConfigError, match="paper-dsgd"):
        validate({"strategy": "dpfedavg-hu", "hu-accountant": "paper-dsgd", "hu-local-steps": 2})
    with pytest.raises(ConfigError, match="hu-clip = 0"):
        validate({"strategy": "dpfedavg-hu", "hu-clip": 0.0, "target-epsilon": 1.0})
    with pytest.raises(ConfigError, match="at most 16"):
        validate({"dataset": "adult", "adult-split": "hu-devices", "num-clients": 20})


def _client(tmp_path, **kw):
    config = validate({"strategy": "dpfedavg-hu", "num-clients": 4, "batch-size": 4, "target-epsilon": 1.0, "target-delta": 1e-4,
                       "hu-accountant": "conservative", "results-dir": str(tmp_path), **kw})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3, 2))
    ledger = PrivacyLedger(path=tmp_path / "ledger.json")
    return SimpleNamespace(config=config, model=model, x=torch.randn(12, 3), y=torch.randint(0, 2, (12,)),
                           num_train=12, partition=0, ledger=ledger, run_id=0)


def test_client_records_zcdp_and_refuses_past_its_budget(tmp_path):
    client = _client(tmp_path, **{"hu-local-steps": 2})
    kw = dict(local_steps=2, clip=1.0, dataset_size=12, batch_size=4)
    sigma = calibrate_sigma("conservative", 1.0, 1e-4, 3, **kw)  # exactly 3 participations fit
    content = RecordDict({"arrays": model_to_arrays(client.model), "config": ConfigRecord({
        "server-round": 1, "hu-sigma": sigma, "hu-local-steps": 2, "hu-clip": 1.0, "hu-accountant": "conservative"})})
    for t in (1, 2, 3):
        content["config"]["server-round"] = t
        reply = hu_update(client, content, RecordDict())
        assert reply["metrics"]["num-examples"] == 12
    assert [e.kind for e in client.ledger.entries] == ["zcdp"] * 3
    assert client.ledger.epsilon(1e-4, "hu-thm1") == pytest.approx(1.0, rel=1e-9)
    assert PrivacyLedger.load(tmp_path / "ledger.json").entries[0].params["rho"] > 0  # on disk
    content["config"]["server-round"] = 4
    with pytest.raises(BudgetExhausted, match="past the target.*hu-thm1"):
        hu_update(client, content, RecordDict())
    assert len(client.ledger.entries) == 3  # nothing recorded for a refused round
    content["config"]["hu-sigma"] = 0.0
    with pytest.raises(BudgetExhausted, match="sigma = 0"):
        hu_update(client, content, RecordDict())


@pytest.mark.parametrize("asked", [{"hu-accountant": "paper-dsgd"}, {"hu-local-steps": 50}])
def test_client_refuses_an_instruction_with_another_accounting(tmp_path, asked):
    """tau and the accountant are the client's own: an instruction asking for others (charged its way, it
    could spend past the budget) is refused before anything is recorded or trained."""
    client = _client(tmp_path, **{"hu-local-steps": 2})
    content = RecordDict({"arrays": model_to_arrays(client.model), "config": ConfigRecord({
        "server-round": 1, "hu-sigma": 2.0, "hu-local-steps": 2, "hu-clip": 1.0, "hu-accountant": "conservative",
        **asked})})
    with pytest.raises(BudgetExhausted, match=f"instruction asks for {next(iter(asked))}"):
        hu_update(client, content, RecordDict())
    assert len(client.ledger.entries) == 0


@pytest.mark.parametrize("accountant", ["pld", "ali-eq12"])
def test_config_refuses_accountants_that_cannot_compose_zcdp(accountant):
    with pytest.raises(ConfigError, match="only accountant = 'rdp'"):
        _hu_config(accountant=accountant)


def test_non_private_baseline_reports_no_epsilon():
    """hu-sigma = 0 without a budget releases updates with no noise: not private, so no epsilon (not 0)."""
    from common.privacy.plan import is_private
    from server.privacy_mirror import PrivacyMirror

    config = validate({"strategy": "dpfedavg-hu", "num-clients": 2, "hu-sigma": 0.0, "hu-clip": 0.0})
    mirror = PrivacyMirror(config, [0, 1])
    assert not is_private(config) and mirror.round_metrics() == {}
    assert is_private(_hu_config()) and is_private(validate({"strategy": "dpfedavg-hu", "hu-sigma": 1.0}))


def test_run_with_secure_aggregation_takes_the_credit_and_stays_in_budget(tmp_path):
    """dpfedavg-hu on the synthetic federation, paper accountant, secure aggregation: every client's
    ledger holds one zCDP entry per participation with r = 3, and the run ends at epsilon <= target."""
    config = validate({"strategy": "dpfedavg-hu", "dataset": "synthetic", "num-clients": 4, "fraction-train": 0.75,
                       "num-rounds": 3, "batch-size": 8, "hu-local-steps": 4, "lr": 0.3, "target-epsilon": 4.0, "target-delta": 1e-4,
                       "hu-accountant": "paper", "secure-aggregation": True, "secagg-min-survivors": 3, "seed": 2,
                       "dp-noise-seed": "run-seed",  # the accuracy check below must not depend on fresh noise
                       "results-dir": str(tmp_path), "run-name": "hu"})
    out = run_inprocess(config)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients"] for r in rows] == [3, 3, 3] and all(r["secagg_survivors"] == 3 for r in rows)
    ledgers = sorted((tmp_path / "node-state").rglob("*.ledger.json"))
    assert len(ledgers) == 4
    total = 0
    for path in ledgers:
        ledger = PrivacyLedger.load(path)
        assert all(e.kind == "zcdp" and e.meta["clients_per_round"] == 3 for e in ledger.entries)
        assert ledger.epsilon(1e-4, "hu-thm1") <= 4.0 * (1 + 1e-9)
        total += len(ledger.entries)
    assert total == 9 and np.isfinite(rows[-1]["loss"])


def test_budget_refusals_pass_through_secure_aggregation(tmp_path):
    """A client whose ledger is already near the budget (spent in an earlier part of the run) refuses
    under secure aggregation: its typed refusal reaches the runner through the secure grid (error
    replies are passed up, they carry no data), the runner stops selecting it, the round is decoded
    from the others, and the refusing client's ledger is unchanged."""
    from client.privacy import ledger_path
    from common.privacy.events import zcdp_release
    from common.privacy.accounting import zcdp_rho_for_epsilon
    from server.inprocess_grid import InProcessGrid
    from server.runner import run_federation
    from server.sampling import sample_partitions

    config = validate({"strategy": "dpfedavg-hu", "dataset": "synthetic", "num-clients": 4, "fraction-train": 0.75,
                       "num-rounds": 5, "batch-size": 8, "hu-local-steps": 2, "lr": 0.3, "target-epsilon": 5.0,
                       "target-delta": 1e-4, "hu-accountant": "conservative", "secure-aggregation": True,
                       "seed": 2, "results-dir": str(tmp_path), "run-name": "hu"})
    run_id = 77
    spent_path = ledger_path(config, {}, run_id, 0)
    spent = PrivacyLedger.open(spent_path, owner="partition-0")
    spent.record(zcdp_release(0.999 * zcdp_rho_for_epsilon(5.0, 1e-4), round=0))  # nearly the whole budget
    with InProcessGrid("client.app:app", dict(config), 4, run_id=run_id) as grid:
        out = run_federation(grid, config)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    refusing = [r for r in rows if r.get("secagg_survivors", 0) < r["clients"]]
    assert refusing, "partition 0 should have refused once"
    first = refusing[0]
    assert first["round"] == 1 and first["secagg_survivors"] == first["clients"] - 1  # decoded from the others
    # partition 0 is no longer selected; the others keep the draws sigma was calibrated on (seed 2, round 2)
    drawn = [p for p in sample_partitions(2, 2, [0, 1, 2, 3], 0.75) if p != 0]
    assert rows[1]["clients"] == rows[1]["secagg_survivors"] == len(drawn)
    assert len(PrivacyLedger.load(spent_path)) == 1  # the refusal left its ledger unchanged
    for path in (tmp_path / "node-state").rglob("*.ledger.json"):
        assert PrivacyLedger.load(path).epsilon(1e-4, "hu-thm1") <= 5.0 * (1 + 1e-9)


def test_upcycled_calibrates_sigma_over_its_training_rounds_only():
    """Under Upcycled-FL only odd rounds train, drawn by training round (t + 1) // 2: sigma is calibrated
    for those draws, so every device ends exactly at the target, not below it from noise for rounds that
    never train."""
    from collections import Counter

    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from server.strategies.registry import build_strategy

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    strategy = build_strategy(_hu_config(upcycled=True), _roster(), lambda _: None)
    base = strategy.base
    count = Counter()
    for t in range(1, 21):
        for msg in strategy.configure_train(t, ArrayRecord([np.zeros(2, np.float32)]), ConfigRecord(), None):
            count[msg.metadata.dst_node_id - 1000] += 1
    assert base.schedule == {p: count[p] for p in range(16)} and sum(count.values()) == 100
    spent = max(zcdp_epsilon(count[p] * base.round_rho(p), 1e-4) for p in range(16))
    assert spent == pytest.approx(10.0, rel=1e-6) and spent <= 10.0


@pytest.mark.parametrize("accountant", ["conservative", "paper", "paper-dsgd"])
def test_calibrated_sigma_never_exceeds_the_target(accountant):
    """Rounding in the closed form must not put the composed epsilon (a sum of C entries) past the target."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        epsilon, delta = float(rng.uniform(0.05, 30)), float(rng.choice([1e-4, 1e-5, 1e-6]))
        C = int(rng.integers(1, 300))
        kw = dict(local_steps=1 if accountant == "paper-dsgd" else int(rng.integers(1, 50)),
                  clip=float(rng.uniform(0.01, 5)), dataset_size=int(rng.integers(100, 5000)),
                  batch_size=int(rng.integers(1, 60)), clients_per_round=int(rng.integers(1, 10)), num_clients=16)
        sigma = calibrate_sigma(accountant, epsilon, delta, C, **kw)
        assert zcdp_epsilon(math.fsum([round_rho(accountant, sigma, **kw)] * C), delta) <= epsilon


def test_stragglers_are_refused_not_silently_ignored():
    """Stragglers shorten local epochs; Hu's clients run their own tau steps whatever the instruction says."""
    from server.strategies.registry import build_strategy

    with pytest.raises(ConfigError, match="stragglers = 0"):
        build_strategy(_hu_config(stragglers=0.5), _roster(), lambda _: None)
    assert build_strategy(_hu_config(), _roster(), lambda _: None).stragglers == 0.0


def test_a_round_that_cannot_train_spends_no_budget(tmp_path):
    """A model that does not fit, or a batch larger than the local data (the paper accountant does not
    check it), fails before the ledger is charged: the server's mirror records nothing for an error reply."""
    client = _client(tmp_path, **{"hu-local-steps": 2})
    cfg = {"server-round": 1, "hu-sigma": 2.0, "hu-local-steps": 2, "hu-clip": 1.0, "hu-accountant": "conservative"}
    wrong = RecordDict({"arrays": ArrayRecord([np.zeros(5, np.float32)]), "config": ConfigRecord(cfg)})
    with pytest.raises(ValueError, match="arrays do not match"):
        hu_update(client, wrong, RecordDict())
    assert len(client.ledger.entries) == 0
    big = _client(tmp_path / "big", **{"hu-local-steps": 2, "hu-accountant": "paper", "batch-size": 20})
    content = RecordDict({"arrays": model_to_arrays(big.model),
                          "config": ConfigRecord({**cfg, "hu-accountant": "paper"})})
    with pytest.raises(ValueError, match="exceeds the local dataset"):
        hu_update(big, content, RecordDict())
    assert len(big.ledger.entries) == 0
    with pytest.raises(ValueError, match="exceeds the local dataset"):  # the server stops such a run first
        DpFedAvgHu(_roster(m=1000), 0, 0.625, lambda _: None, config=_hu_config(**{"hu-accountant": "paper"}))


def test_without_a_budget_the_client_keeps_its_own_sigma(tmp_path):
    """target-epsilon = 0: the run config's hu-sigma is the client's guarantee; less noise is refused."""
    client = _client(tmp_path, **{"hu-local-steps": 2, "target-epsilon": 0.0, "hu-sigma": 1.0})
    cfg = {"server-round": 1, "hu-sigma": 1e-6, "hu-local-steps": 2, "hu-clip": 1.0, "hu-accountant": "conservative"}
    content = RecordDict({"arrays": model_to_arrays(client.model), "config": ConfigRecord(cfg)})
    with pytest.raises(BudgetExhausted, match="below this client's hu-sigma"):
        hu_update(client, content, RecordDict())
    assert len(client.ledger.entries) == 0
    content["config"]["hu-sigma"] = 1.0
    assert hu_update(client, content, RecordDict())["metrics"]["num-examples"] == 12
    assert len(client.ledger.entries) == 1


# --- a retired client must not shift the others' draws (review of session 19) ----------------------------
class ExcludingGrid:
    """What retire_excluded reads of a SecureAggregationGrid: the nodes it left out for the rest of the run."""

    def __init__(self, excluded):
        self.excluded = excluded


@pytest.mark.parametrize("upcycled", [False, True], ids=["vanilla", "upcycled"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_node_secure_aggregation_excludes_does_not_push_hu_clients_past_their_calibrated_budget(seed, upcycled):
    """dpfedavg-hu calibrates sigma so that every device ends at most at target-epsilon after its C_i
    participations of the schedule drawn in advance (server/strategies/dpfedavg_hu.py). Once secure
    aggregation excludes node 100 (partition 0), retire_excluded retires it; drawing r = 3 clients per round
    from the 9 others pushed them past the schedule: (seed 1) partition 2 drawn 9 times where the largest
    C_i is 8, epsilon 2.126 > 2.0 (review of session 19). Every other client must be instructed exactly its
    C_i times, Upcycled's draws keyed by the training round included."""
    from collections import Counter

    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from common.privacy.accounting import zcdp_epsilon
    from server.runner import retire_excluded
    from server.strategies.registry import build_strategy

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 7
    rounds = 39 if upcycled else 20  # 20 training rounds either way
    cfg = validate({"strategy": "dpfedavg-hu", "dataset": "adult", "num-clients": 10, "fraction-train": 0.3,
                    "num-rounds": rounds, "target-epsilon": 2.0, "secure-aggregation": True, "upcycled": upcycled,
                    "secagg-min-survivors": 2, "hu-local-steps": 1, "batch-size": 32, "seed": seed})
    roster = Roster(node_of={p: 100 + p for p in range(10)}, num_examples={p: 320 for p in range(10)})
    strategy = build_strategy(cfg, roster, lambda *_: None)
    retire_excluded(ExcludingGrid({100: "its masked update in round 1 was unusable"}), strategy, roster,
                    lambda *_: None)
    hu = getattr(strategy, "base", strategy)
    arrays = ArrayRecord({"w": torch.zeros(3)})
    drawn: Counter = Counter()
    for t in range(1, rounds + 1):
        for m in strategy.configure_train(t, arrays, ConfigRecord({}), None):
            drawn[m.metadata.dst_node_id - 100] += 1
    assert drawn[0] == 0 and {p: drawn[p] for p in range(1, 10)} == {p: hu.schedule[p] for p in range(1, 10)}
    spent = {p: zcdp_epsilon(n * hu.round_rho(p), hu.delta) for p, n in drawn.items()}
    assert max(spent.values()) <= 2.0 + 1e-9, spent


# --- an adversarial review, session 21: each test failed on the code it reviewed ----------------------------
def _hu_paper_secagg(**kw):
    return _hu_config(**{"hu-accountant": "paper", "secure-aggregation": True, "secagg-min-survivors": 10, **kw})


def test_small_target_epsilon_calibration_stays_within_the_target_and_the_client_accepts_it(tmp_path):
    """calibrate_sigma promises 'rounding never puts epsilon past the target', but
    zcdp_rho_for_epsilon computes (sqrt(L + eps) - sqrt(L))^2 with catastrophic cancellation: at
    target-epsilon = 1e-8 (a value validate() accepts) the calibrated sigma spends 6.0e-8 relative past
    the target, beyond the client's 1e-9 tolerance, so the device drawn most often is refused (BudgetExhausted)
    at its last scheduled participation, although the server calibrated sigma for exactly that schedule."""
    eps = 1e-8
    server = DpFedAvgHu(_roster(), 0, 0.625, lambda _: None, config=_hu_paper_secagg(**{"target-epsilon": eps}))
    assert server.planned_epsilon() <= eps  # observed 1.0000000602546747e-08

    config = validate({"strategy": "dpfedavg-hu", "num-clients": 4, "batch-size": 4, "target-epsilon": eps,
                       "target-delta": 1e-4, "hu-accountant": "conservative", "hu-local-steps": 2,
                       "results-dir": str(tmp_path)})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3, 2))
    client = SimpleNamespace(config=config, model=model, x=torch.randn(12, 3), y=torch.randint(0, 2, (12,)),
                             num_train=12, partition=0, ledger=PrivacyLedger(path=tmp_path / "l.json"), run_id=0)
    sigma = calibrate_sigma("conservative", eps, 1e-4, 3, local_steps=2, clip=1.0, dataset_size=12, batch_size=4)
    content = RecordDict({"arrays": model_to_arrays(model), "config": ConfigRecord({
        "server-round": 1, "hu-sigma": sigma, "hu-local-steps": 2, "hu-clip": 1.0, "hu-accountant": "conservative"})})
    for t in (1, 2, 3):  # exactly the 3 participations sigma was calibrated for
        content["config"]["server-round"] = t
        hu_update(client, content, RecordDict())  # the 3rd raises BudgetExhausted on the reviewed code
    assert len(client.ledger.entries) == 3


def test_tiny_target_epsilon_is_a_clear_error_not_a_zero_division():
    """target-epsilon = 1e-17 passes validate() (a finite float >= 0), then the server's calibration
    divides by rho* = (sqrt(L + 1e-17) - sqrt(L))^2 == 0.0 and dies with a bare ZeroDivisionError
    ('float division by zero'), naming no key."""
    config = _hu_paper_secagg(**{"target-epsilon": 1e-17})
    try:
        server = DpFedAvgHu(_roster(), 0, 0.625, lambda _: None, config=config)
    except ValueError as exc:  # a refusal is fine if it says which setting (ConfigError is a ValueError)
        assert "epsilon" in str(exc)
    else:  # or a cancellation-free rho* calibrates it, within the target
        assert 0 < server.sigma < float("inf") and server.planned_epsilon() <= 1e-17


def test_a_large_hu_target_epsilon_calibrates_instead_of_overflowing():
    """(review of this session's later diff) The first cancellation-free rewrite of rho* = (sqrt(L + eps) - sqrt(L))^2 as eps**2 / (sqrt(L + eps) + sqrt(L))**2 to avoid
    cancellation for a small eps. For eps above ~1.3e154, `eps ** 2` raises OverflowError (Python's float
    power does not return inf), where the old formula returned rho* ~ eps. target-epsilon accepts any finite
    number >= 0 (validate below), so a dpfedavg-hu run with target-epsilon = 1e200 (a "no real budget"
    setting) now dies in DPFedAvgHu.__init__ with an OverflowError traceback. Measured:
    zcdp_rho_for_epsilon(1e155, 1e-5) -> OverflowError (34, 'Numerical result out of range');
    1e154 -> 1e154. Fix: square the ratio, (eps / (sqrt(L + eps) + sqrt(L))) ** 2."""
    validate({"strategy": "dpfedavg-hu", "dataset": "adult", "target-epsilon": 1e200})  # a valid config
    delta = 1e-5
    rho = zcdp_rho_for_epsilon(1e200, delta)  # OverflowError on the reviewed code
    assert math.isfinite(rho) and zcdp_epsilon(rho, delta) <= 1e200 * (1 + 1e-12)
    kw = {"local_steps": 5, "clip": 1.0, "dataset_size": 3052, "batch_size": 32}
    sigma = calibrate_sigma("conservative", 1e200, delta, 10, **kw)
    assert 0 < sigma < math.inf
    assert zcdp_epsilon(10 * round_rho("conservative", sigma, **kw), delta) <= 1e200


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_the_paper_credit_never_exceeds_the_noise_in_the_decoded_sum(tmp_path):
    """The credit /r assumes the released sum is sum_j theta_j; the secure grid summed w_j d_j, w_j = n_j / n_max,
    so client i was hidden by sum_j (w_j / w_i)^2 clients' worth of noise, not r: the largest client of
    unequal partitions was credited 2 with 1.464 in the sum (rho understated 1.37x), after a dropout more so.
    The grid now sums Hu et al.'s models unweighted, as the paper."""
    from flwr.app import MessageType

    from client.secagg import RECORD
    from fault_grids import Recorder
    from server.inprocess_grid import InProcessGrid
    from server.runner import run_federation

    config = validate({"strategy": "dpfedavg-hu", "dataset": "synthetic", "num-clients": 4, "fraction-train": 1.0,
                       "num-rounds": 1, "batch-size": 8, "hu-local-steps": 4, "lr": 0.3, "target-epsilon": 4.0,
                       "target-delta": 1e-4, "hu-accountant": "paper", "secure-aggregation": True,
                       "secagg-min-survivors": 2, "seed": 2, "results-dir": str(tmp_path), "run-name": "hu"})
    with InProcessGrid("client.app:app", dict(config), 4) as grid:
        nodes = list(grid.get_node_ids())
        partition_of = {n: int(grid.contexts[n].node_config["partition-id"]) for n in nodes}
        recorder = Recorder(grid, drop={1: 1})  # round 1: the reply of the second node is lost
        out = run_federation(recorder, config)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["clients"] == 4 and row["secagg_survivors"] == 3  # decoded from 3 >= min-survivors = 2
    survivors = {partition_of[n] for n in nodes} - {partition_of[nodes[1]]}

    ledgers = {int(p.name.split("-")[1].split(".")[0]): PrivacyLedger.load(p)
               for p in (tmp_path / "node-state").rglob("partition-*.ledger.json")}
    size = {p: int(ledger.entries[0].meta["dataset_size"]) for p, ledger in ledgers.items()}
    # the weights the grid announced for the model record: w_j = n_j / weight-scale, or 1 if unit-weight
    announced = next(m.content[RECORD] for m in recorder.sent
                     if m.metadata.message_type == MessageType.TRAIN and RECORD in m.content)
    unit = "arrays" in str(announced["unit-records"]).split(",")
    weight = {p: 1.0 if unit else size[p] / float(announced["weight-scale"]) for p in size}

    overstated = {}
    for p in survivors:
        credited = ledgers[p].entries[0].meta["clients_per_round"]  # the /r the ledger (and mirror) took
        # client p's noise-to-sensitivity in the released sum sum_j w_j d_j, in units of its own noise
        in_sum = sum((weight[j] / weight[p]) ** 2 for j in survivors)
        if credited > in_sum + 1e-9:
            overstated[p] = (credited, round(in_sum, 3), size[p])
    assert not overstated, (
        f"the /r credit exceeds the noise in the decoded weighted sum (partition: (credited r, effective "
        f"clients' noise in the sum, m)): {overstated}; sizes {size}, survivors {sorted(survivors)}")


def test_secure_and_plain_runs_aggregate_the_same_unweighted_mean(tmp_path):
    """Secure and plain runs aggregate the same mean, the paper's unweighted (1/r) sum_i theta_i."""
    def final_model(name, **extra):
        config = validate({"strategy": "dpfedavg-hu", "dataset": "synthetic", "num-clients": 4, "fraction-train": 0.75,
                           "num-rounds": 2, "batch-size": 8, "hu-local-steps": 4, "lr": 0.3, "hu-sigma": 0.5,
                           "target-delta": 1e-4, "seed": 2, "dp-noise-seed": "run-seed",
                           "results-dir": str(tmp_path), "run-name": name, **extra})
        with np.load(run_inprocess(config) / "model.npz") as m:
            return {k: m[k] for k in m.files}

    secure = final_model("secure", **{"secure-aggregation": True, "secagg-min-survivors": 3})
    plain = final_model("plain")
    assert all(np.allclose(secure[k], plain[k], atol=1e-5) for k in plain)
