import tomllib
from pathlib import Path

import pytest

from common.config import SCHEMA, ConfigError, defaults, load_preset, validate

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_key_with_the_schema_default():
    app_config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert app_config == defaults()


def test_defaults_validate():
    assert dict(validate({})) == defaults()


def test_unknown_key_names_it_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'num-round'.*'num-rounds'"):
        validate({"num-round": 3})


@pytest.mark.parametrize("key,value,pattern", [
    ("num-rounds", "ten", r"'num-rounds' must be an int >= 1; got 'ten'"),
    ("num-rounds", 0, r"'num-rounds' must be an int >= 1"),
    ("num-rounds", True, r"'num-rounds' must be"),
    ("fraction-train", 0.0, r"'fraction-train' must be a float in \(0.0, 1.0\]"),
    ("fraction-train", 1.5, r"'fraction-train'"),
    ("dataset", "imagenet", r"'dataset' must be one of 'synthetic'"),
    ("synthetic-iid", 1, r"'synthetic-iid' must be a bool"),
    ("run-name", "a\nb", r"run-name must be a single folder name .*control characters"),
    ("momentum", 1.0, r"'momentum' must be a float in \[0.0, 1.0\)"),  # the velocity would never decay
    ("fedlap-image-momentum", 1.0, r"'fedlap-image-momentum' must be a float in \[0.0, 1.0\)"),
])
def test_bad_values_name_key_and_allowed(key, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate({key: value})


def test_int_accepted_for_float():
    assert validate({"lr": 1})["lr"] == 1.0


def test_released_federation_needs_30_clients():
    with pytest.raises(ConfigError, match="num-clients = 30"):
        validate({"dataset": "syn-iid", "num-clients": 10})


def test_every_key_documented():
    assert all(spec.doc for spec in SCHEMA.values())


def test_every_preset_is_valid():
    presets = sorted((REPO / "presets").glob("*.toml"))
    assert presets, "no presets found"
    for preset in presets:
        load_preset(preset)


def test_preset_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = 0.1\nepochs = 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'epochs'"):
        load_preset(bad)
    with pytest.raises(ConfigError, match="preset file not found"):
        load_preset(tmp_path / "missing.toml")


@pytest.mark.parametrize("strategy", ["fedlap", "ali-dpfl"])
def test_upcycled_refuses_strategies_it_cannot_wrap(strategy):
    """FedLAP's clients key their draws on the server round (vanilla and Upcycled would not share them),
    and ALI-DPFL plans tau* over rounds that all train."""
    raw = {"strategy": strategy, "upcycled": True}
    if strategy == "ali-dpfl":
        raw.update({"privacy": "dpsgd", "target-epsilon": 2.0, "local-steps": 1})
    with pytest.raises(ConfigError, match="cannot run with upcycled = true"):
        validate(raw)


def test_a_pfedme_step_that_diverges_whatever_the_data_is_refused():
    """pFedMe's personal step scales theta by |1 - lr (lambda + mu)| per inner step: lr 0.2 with the default
    lambda 15 (factor 2 per step) blew up to a loss of 2e6 and a 6 % "result" (review of session 19)."""
    with pytest.raises(ConfigError, match="pfedme-lambda"):
        validate({"strategy": "pfedme", "lr": 0.2})
    validate({"strategy": "pfedme", "lr": 0.1})  # the default: factor 0.5


# --- keys a run would silently ignore, and values that escape ConfigError (review of session 19) ----------
@pytest.mark.parametrize("run, key", [
    ({"privacy": "dpsgd", "local-steps": 10, "local-epochs": 5}, "local-epochs"),  # DP-SGD runs local-steps
    ({"privacy": "dpsgd", "local-steps": 10, "batch-size": 256}, "batch-size"),  # Poisson lots at dp-sample-rate
    ({"strategy": "fedlap", "stragglers": 0.5}, "stragglers"),  # FedLAP never reads local-epochs
    ({"strategy": "fedlap", "local-epochs": 5}, "local-epochs"),
    ({"strategy": "dpfedavg-hu", "local-epochs": 5}, "local-epochs"),  # hu-local-steps
    ({"strategy": "fedlap", "momentum": 0.9}, "momentum"),  # plain SGD
    ({"strategy": "dpfedavg-hu", "momentum": 0.9}, "momentum"),
    ({"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 2.0, "local-steps": 50}, "local-steps"),
    ({"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 2.0, "ali-tau-init": 200, "ali-tau-max": 10},
     "ali-tau-init"),  # clamped silently
    ({"lr": 10**400}, "lr"),  # a valid TOML int: float() overflowed with a bare OverflowError
])
def test_a_key_the_run_would_not_use_as_given_is_refused(run, key):
    """Each was accepted, and runs with different values of the key were bit-identical."""
    with pytest.raises(ConfigError, match=key):
        validate(run)


def test_ali_dpfl_needs_no_local_steps():
    """Its server sends every round's tau: validation demanded a local-steps > 0 that nothing read."""
    validate({"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 2.0})


def test_an_ali_budget_too_small_for_one_step_is_a_config_error():
    """It was a bare ValueError raised while the server built its strategy, after the nodes had started."""
    with pytest.raises(ConfigError, match=r"target-epsilon = 0.01 allows no DP-SGD step at dp-sample-rate = 0.015"):
        validate({"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 0.01, "dp-sample-rate": 0.015})


def test_validate_refuses_ali_dpfl_with_noise_too_large_to_bound_rc_with_a_config_error():
    """(A fuzzing review, session 20.) ALI-DPFL with a noise so large that epsilon never reaches target-epsilon within the step cap:
    `validate` raises a bare ValueError from the accountant's bracket search (common/privacy/accounting.py,
    `grown`), not a ConfigError, so `privfed run` (which catches ConfigError around validate) prints a
    raw traceback instead of a one-line refusal naming the keys."""
    raw = {"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 1.0,
           "dp-noise-multiplier": 50.0, "dp-sample-rate": 1e-4}
    with pytest.raises(ConfigError, match="dp-noise-multiplier|target-epsilon"):
        validate(raw)


# --- a config fuzzer (review, session 21): each test failed on the code it reviewed -----------------------
ALI_DPSGD = {"strategy": "ali-dpfl", "privacy": "dpsgd"}


def test_ali_huge_target_epsilon_is_a_config_error_not_overflow():
    # target-epsilon has no upper bound; R_c's secant search overflows ((...) ** 2) and validate() leaks an
    # OverflowError (a traceback from `privfed run`) instead of ConfigError. 1e150 still gives ConfigError.
    with pytest.raises(ConfigError):
        validate({**ALI_DPSGD, "target-epsilon": 1e200})


def test_ali_tiny_noise_multiplier_is_a_config_error_not_zero_division():
    # dp-noise-multiplier has no positive lower bound; sigma**2 underflows to 0 and the RDP accountant
    # divides by it: validate() leaks ZeroDivisionError. 1e-160 still gives ConfigError ("allows no step").
    with pytest.raises(ConfigError):
        validate({**ALI_DPSGD, "target-epsilon": 8.0, "dp-noise-multiplier": 1e-200})


@pytest.mark.parametrize("dataset, extra", [("synthetic", {}), ("adult", {}), ("syn-iid", {"num-clients": 30})])
def test_fedlap_default_dsa_on_flat_dataset_refused_by_validate(dataset, extra):
    # fedlap-dsa defaults to true; on a dataset of feature vectors validate() accepts the config and the
    # run then dies in FedLap.__init__ (server/strategies/fedlap.py) with "fedlap-dsa = true augments
    # images". The dataset kind is static (IMAGE_SIZES), like _check_model_inputs' check.
    with pytest.raises(ConfigError, match="fedlap-dsa"):
        validate({"strategy": "fedlap", "dataset": dataset, **extra})


def test_ali_budget_too_large_target_advice_points_the_right_way():
    """(review, session 21) target-epsilon = 1e7 at sigma 1.0, q 0.01: epsilon stays below the target beyond the accountant's 1e9-step
    scan, so R_c cannot be bounded. The fix is a SMALLER target (or a larger sample rate / smaller sigma, so epsilon
    grows faster). The ConfigError said "lower ...
    dp-sample-rate, or raise target-epsilon": both of those make it worse. Following the advice (1e8) fails
    again with the same message, while a lower target (1e3) validates."""
    with pytest.raises(ConfigError) as info:
        validate({**ALI_DPSGD, "dataset": "synthetic", "model": "logreg", "dp-noise-multiplier": 1.0,
                  "dp-sample-rate": 0.01, "target-epsilon": 1e7})
    msg = str(info.value)
    assert "needs a finite step budget" in msg
    validate({**ALI_DPSGD, "dp-noise-multiplier": 1.0, "dp-sample-rate": 0.01, "target-epsilon": 1e3})  # the real fix: lower the target
    assert "raise target-epsilon" not in msg, msg
    assert "lower dp-noise-multiplier or dp-sample-rate" not in msg, msg
