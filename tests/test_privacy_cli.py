"""`privfed privacy`: the calculator's text and JSON output."""

import json

import pytest

from cli.main import main
from common.privacy.events import dpsgd_steps, post_processing
from common.privacy.ledger import PrivacyLedger


def _run(capsys, *argv):
    rc = main(["privacy", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_epsilon_json_and_text(capsys):
    rc, out, _ = _run(capsys, "epsilon", "--q", "0.0256", "--sigma", "1", "--steps", "3000", "--delta", "1e-5",
                      "--json")
    assert rc == 0
    obj = json.loads(out)
    assert obj["epsilon"] == pytest.approx(10.18, abs=0.02)
    assert {k: obj[k] for k in ("delta", "relation", "sampling", "accountant")} == {
        "delta": 1e-5, "relation": "add-remove", "sampling": "poisson", "accountant": "rdp"}
    rc, out, _ = _run(capsys, "epsilon", "--q", "0.0256", "--sigma", "1", "--steps", "200", "--delta", "1e-5")
    assert rc == 0 and "epsilon = 2.78" in out and out.count("\n") == 1


def test_epsilon_pld_is_below_rdp(capsys):
    args = ["epsilon", "--q", "0.0256", "--sigma", "1", "--steps", "200", "--delta", "1e-5", "--json"]
    rdp = json.loads(_run(capsys, *args)[1])["epsilon"]
    pld = json.loads(_run(capsys, *args, "--accountant", "pld")[1])["epsilon"]
    classic = json.loads(_run(capsys, *args, "--conversion", "classic")[1])["epsilon"]
    assert pld < rdp < classic


def test_sigma_and_steps(capsys):
    rc, out, _ = _run(capsys, "sigma", "--epsilon", "2.79", "--delta", "1e-5", "--q", "0.0256", "--steps", "200",
                      "--json")
    assert rc == 0 and json.loads(out)["sigma"] == pytest.approx(1.0, abs=2e-3)
    common = ["--epsilon", "2", "--delta", "1e-5", "--q", "0.015", "--sigma", "1.1", "--conversion", "classic",
              "--orders", "integer", "--json"]
    assert json.loads(_run(capsys, "steps", *common)[1])["steps"] == 314
    assert json.loads(_run(capsys, "steps", *common, "--search", "ali-code")[1])["steps"] == 317
    rc, out, _ = _run(capsys, "steps", *common[:-1])
    assert rc == 0 and out.startswith("R_c = 314 steps")


def test_errors_go_to_stderr_with_status_2(capsys):
    rc, out, err = _run(capsys, "epsilon", "--q", "2", "--sigma", "1", "--steps", "10", "--delta", "1e-5")
    assert rc == 2 and out == "" and "error" in err
    with pytest.raises(SystemExit):
        main(["privacy", "epsilon", "--q", "0.1", "--sigma", "1", "--steps", "10", "--delta", "1e-5",
              "--accountant", "moments"])


def test_sigma_prints_the_digits_of_its_tolerance_and_refuses_a_zero_one(capsys):
    """--tol 1e-6 printed 4 decimals (a sigma rounded below the target's); --tol 0 divided by zero."""
    args = ["sigma", "--epsilon", "1", "--delta", "1e-5", "--q", "0.002", "--steps", "200"]
    rc, out, _ = _run(capsys, *args, "--tol", "1e-6")
    assert rc == 0 and out.startswith("sigma = 0.885296:")
    rc, out, err = _run(capsys, *args, "--tol", "0")
    assert rc == 2 and out == "" and "tol must be in (0, 0.1]" in err


def test_ledger_report(capsys, tmp_path):
    path = tmp_path / "ledger.json"
    PrivacyLedger([dpsgd_steps(0.0256, 1.0, 200, round=1), post_processing(round=2, note="even round")]).save(path)
    rc, out, _ = _run(capsys, "ledger", str(path), "--delta", "1e-5")
    assert rc == 0 and "round 2: post-processing (even round)" in out and "epsilon [pld]" in out
    rc, out, _ = _run(capsys, "ledger", str(path), "--delta", "1e-5", "--json")
    assert json.loads(out)["epsilon"] == pytest.approx(2.79, abs=0.02)
    rc, _, err = _run(capsys, "ledger", str(tmp_path / "missing.json"), "--delta", "1e-5")
    assert rc == 2 and "error" in err

def test_ledger_conversion_changes_the_rdp_figure_and_is_refused_where_none_prints(capsys, tmp_path):
    path = tmp_path / "ledger.json"
    PrivacyLedger([dpsgd_steps(0.0256, 1.0, 200, round=1)]).save(path)
    eps = {c: json.loads(_run(capsys, "ledger", str(path), "--delta", "1e-5", "--json", "--conversion", c)[1])
           ["epsilon"] for c in ("classic", "balle")}
    assert eps["balle"] < eps["classic"]
    rc, _, err = _run(capsys, "ledger", str(path), "--delta", "1e-5", "--accountant", "pld", "--json",
                      "--conversion", "classic")
    assert rc == 2 and "--conversion applies to an RDP figure" in err
    rc, _, err = _run(capsys, "ledger", str(path), "--delta", "1e-5", "--accountant", "hu-thm1", "--conversion",
                      "balle")
    assert rc == 2 and "--conversion" in err
    rc, out, _ = _run(capsys, "ledger", str(path), "--delta", "1e-5", "--accountant", "pld", "--conversion",
                      "classic")  # the text prints the RDP line too
    assert rc == 0 and "epsilon [rdp" in out


# --- an adversarial review, session 21: each test failed on the code it reviewed ---------------------------
def _ledger(path, entries):
    lines = [{"format": "privfed-privacy-ledger", "version": 2, "owner": "c0"}, *entries]
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    return str(path)


def test_privacy_epsilon_zero_steps_refuses_delta_above_one(capsys):
    # delta >= 1 is refused for steps > 0, but with --steps 0 it prints "epsilon = 0 at delta = 2".
    rc = main(["privacy", "epsilon", "--q", "0.01", "--sigma", "1", "--steps", "0", "--delta", "2"])
    assert rc == 2
    assert "delta" in capsys.readouterr().err


def test_privacy_ledger_negative_pure_epsilon_is_refused(tmp_path, capsys):
    # A damaged ledger whose pure entry has epsilon -5 reports a NEGATIVE total epsilon, exit 0.
    path = _ledger(tmp_path / "x.ledger.json", [
        {"kind": "zcdp", "round": 1, "params": {"rho": 0.1, "relation": "replace-one"}, "meta": {}},
        {"kind": "pure", "round": 2, "params": {"epsilon": -5, "relation": "replace-one"}, "meta": {}},
    ])
    rc = main(["privacy", "ledger", path, "--delta", "1e-5", "--json"])
    out = capsys.readouterr().out
    assert rc == 2, f"a ledger with a negative epsilon entry was reported: {out}"


def test_privacy_ledger_nan_noise_multiplier_is_refused(tmp_path, capsys):
    # A damaged ledger whose DP-SGD entries have noise_multiplier NaN reports epsilon 0.0, exit 0.
    entry = {"kind": "dpsgd", "round": 1, "meta": {},
             "params": {"sample_rate": 0.01, "noise_multiplier": float("nan"), "steps": 500,
                        "relation": "add-remove"}}
    path = _ledger(tmp_path / "y.ledger.json", [entry])
    rc = main(["privacy", "ledger", path, "--delta", "1e-5", "--json"])
    out = capsys.readouterr().out
    assert rc == 2, f"a ledger with a NaN noise multiplier was reported: {out}"


def test_privacy_ledger_negative_steps_is_refused(tmp_path, capsys):
    entry = {"kind": "dpsgd", "round": 1, "meta": {},
             "params": {"sample_rate": 0.01, "noise_multiplier": 1.1, "steps": -500, "relation": "add-remove"}}
    path = _ledger(tmp_path / "z.ledger.json", [entry])
    rc = main(["privacy", "ledger", path, "--delta", "1e-5", "--json"])
    out = capsys.readouterr().out
    assert rc == 2, f"a ledger with negative steps was reported: {out}"
