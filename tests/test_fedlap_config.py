"""FedLAP config, privacy plan and the secure-aggregation refusal."""

from pathlib import Path

import pytest

from common.config import SECAGG_STRATEGIES, STRATEGIES, ConfigError, validate
from common.privacy.ledger import PrivacyLedger
from common.privacy.plan import fedlap_accesses, planned_entries

PRESETS = Path(__file__).resolve().parents[1] / "presets"


def test_fedlap_is_a_strategy_but_not_a_secure_aggregation_one():
    assert "fedlap" in STRATEGIES
    assert "fedlap" not in SECAGG_STRATEGIES


def test_secure_aggregation_with_fedlap_is_refused_clearly():
    with pytest.raises(ConfigError, match=r"secure-aggregation = true cannot run strategy 'fedlap'.*individual"):
        validate({"strategy": "fedlap", "secure-aggregation": True, "num-clients": 5})


def test_real_init_refused_under_dp():
    with pytest.raises(ConfigError, match="fedlap-init = 'real'"):
        validate({"strategy": "fedlap", "privacy": "dpsgd", "fedlap-init": "real"})


def test_dp_fedlap_needs_no_local_steps():
    assert validate({"strategy": "fedlap", "dataset": "mnist", "privacy": "dpsgd"})["local-steps"] == 0


def test_paper_plan_is_200_sampled_gaussian_steps_and_epsilon_matches_the_paper():
    config = validate({"strategy": "fedlap", "dataset": "mnist", "privacy": "dpsgd", "dp-sample-rate": 256 / 10000,
                       "dp-noise-multiplier": 1.0, "fedlap-restarts": 4, "fedlap-max-outer": 5,
                       "fedlap-real-batches": 10})
    assert fedlap_accesses(config) == 200
    (entry,) = planned_entries(config, {"server-round": 1})
    assert entry.kind == "dpsgd" and entry.params["steps"] == 200
    ledger = PrivacyLedger()
    ledger.record(entry)
    assert ledger.epsilon(1e-5, accountant="fedlap-thm5.8") == pytest.approx(2.79, abs=0.01)
    for r in range(2, 16):
        ledger.record(*planned_entries(config, {"server-round": r}))
    assert ledger.epsilon(1e-5, accountant="fedlap-thm5.8") == pytest.approx(10.18, abs=0.01)


def test_non_dp_fedlap_plans_nothing():
    assert planned_entries(validate({"strategy": "fedlap", "dataset": "mnist"}), {"server-round": 1}) == []


@pytest.mark.parametrize("suite", ["fedlap-table1", "fedlap-table1/paper", "fedlap-table2", "fedlap-table2/paper",
                                   "fedlap-table2/paper-eps10.18"])
def test_fedlap_suites_load(suite):
    from server.report import load_suite

    loaded = load_suite(suite)
    assert {c.row for c in loaded.cells} >= {"FedLAP"} or {c.row for c in loaded.cells} >= {"FedLAP-DP"}
    for cell in loaded.cells:
        config = validate(cell.overrides)
        if config["privacy"] == "dpsgd":
            assert config["dp-sample-rate"] == pytest.approx(0.0256) and config["dp-noise-multiplier"] == 1.0


def test_presets_validate():
    from common.config import load_preset

    for name in ("fedlap-quick", "fedlap-paper", "fedlap-dp-quick", "fedlap-dp-paper"):
        config = validate(load_preset(PRESETS / f"{name}.toml"))
        assert config["strategy"] == "fedlap"
    paper = validate(load_preset(PRESETS / "fedlap-dp-paper.toml"))
    assert fedlap_accesses(paper) == 200


def test_round_lr_follows_the_authors_cosine_and_keeps_the_last_round_positive():
    from client.updates.fedlap import round_lr

    config = validate({"strategy": "fedlap", "dataset": "mnist", "num-rounds": 5, "lr": 0.1})
    rates = [round_lr(config, m) for m in range(1, 6)]
    assert rates[0] == pytest.approx(0.1) and rates[-1] > 1e-3
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert round_lr(validate({"strategy": "fedlap", "dataset": "mnist", "fedlap-lr-rounds": 3}), 3) == pytest.approx(1e-6)


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_dp_fedlap_refuses_a_batch_size_it_does_not_read():
    """FedLAP-DP's real batches are Poisson samples at dp-sample-rate; batch-size = 77 was accepted and ignored."""
    with pytest.raises(ConfigError, match="batch-size = 77 is not read by DP-SGD"):
        validate({"strategy": "fedlap", "privacy": "dpsgd", "dataset": "synthetic", "fedlap-dsa": False,
                  "target-epsilon": 5.0, "batch-size": 77})
    validate({"strategy": "fedlap", "dataset": "synthetic", "fedlap-dsa": False, "batch-size": 77})  # non-DP reads it
