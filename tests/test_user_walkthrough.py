"""A user's walkthrough of README.md / docs/: documented behaviour that once did not hold (review of session 16)."""

import json

from cli.main import main

# A node ledger exactly as `privfed run upcycled-output` writes it (format version 2, JSON Lines):
# two output-perturbation releases under the paper's sensitivity rule, which carries an assumption.
_ASSUMPTION = ("Upcycled-FL Thm 6.2's sensitivity tau/|D_i| (the clipped model modelled as an average of "
               "per-record terms; clipping does not enforce it: output-sensitivity = 'ball' does)")
_OUTPUT_LEDGER = [
    {"format": "privfed-privacy-ledger", "version": 2, "owner": "partition-0"},
    *({"kind": "gaussian", "round": r,
       "params": {"noise_multiplier": 9.120000000000001, "noise_std": 0.8, "sensitivity": 0.08771929824561403,
                  "count": 1, "relation": "add-remove", "clip_norm": 10.0, "dataset_size": 114, "rule": "paper",
                  "assumption": _ASSUMPTION},
       "meta": {"mechanism": "output-perturbation", "perturb": "model", "train-round": t,
                "sensitivity_rule": "paper: tau/|D_i| (Thm 6.2)"}} for r, t in ((1, 1), (3, 2))),
]
_DPSGD_LEDGER = [
    {"format": "privfed-privacy-ledger", "version": 2, "owner": "partition-0"},
    {"kind": "dpsgd", "round": 1, "params": {"sample_rate": 0.1, "noise_multiplier": 1.0, "steps": 5,
                                             "relation": "add-remove"}, "meta": {}},
]


def _write(tmp_path, lines):
    path = tmp_path / "partition-0.ledger.json"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def _privacy(capsys, *argv):
    rc = main(["privacy", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_privacy_ledger_text_says_the_epsilon_is_not_a_guarantee_when_its_entries_carry_an_assumption(
        capsys, tmp_path):
    """README (Privacy): entries resting on an unenforced bound "carry the assumption" and the final epsilon
    line says "NOT A GUARANTEE of this run: it assumes ...". `privfed run` and `privfed report` say it, but
    `privfed privacy ledger` -- the command a data owner uses to audit its own node's ledger -- prints
    `epsilon [rdp/balle] = 0.6029` with no word of the assumption."""
    rc, out, _ = _privacy(capsys, "ledger", _write(tmp_path, _OUTPUT_LEDGER), "--delta", "1e-5")
    assert rc == 0
    assert "NOT A GUARANTEE" in out and "Thm 6.2" in out, out


def test_privacy_ledger_json_lists_the_assumptions_of_its_entries(capsys, tmp_path):
    """The JSON form states delta, relations and sampling, but drops the assumptions that summary.json
    lists per client (`privacy.ledgers.*.assumptions`): a script reading it takes 0.60 as a guarantee."""
    rc, out, _ = _privacy(capsys, "ledger", _write(tmp_path, _OUTPUT_LEDGER), "--delta", "1e-5", "--json")
    assert rc == 0
    obj = json.loads(out)
    assert obj.get("assumptions") == [_ASSUMPTION], obj


def test_privacy_ledger_refuses_an_out_of_range_delta_like_the_other_calculator_commands(capsys, tmp_path):
    """`privfed privacy epsilon ... --delta 1e5` (a typo for 1e-5) is a one-line error, exit 2; the same typo
    on `privfed privacy ledger` prints the entries, "delta = 100000", two "n/a" epsilon lines and exits 0
    (only the --json form refuses it)."""
    path = _write(tmp_path, _DPSGD_LEDGER)
    for delta in ("1e5", "-1", "1"):
        rc, out, err = _privacy(capsys, "ledger", path, "--delta", delta)
        assert rc == 2 and out == "" and "delta" in err and err.count("\n") == 1, (delta, rc, out, err)


def test_rerunning_a_finished_checkpointed_run_keeps_its_summary_wall_time(tmp_path, one_torch_thread):
    """README: summary.json holds the run's "wall time" and, written whole, marks a finished run. With
    `checkpoint = true` the same command again "resumes" the finished run (no round left) and rewrites
    summary.json with `wall_seconds` of that no-op process only (measured: 1.6 s -> 0.18 s for a 2-round
    DP-SGD run whose rows sum to 1.57 s), so `privfed report` then shows a run shorter than its own rounds.
    runner.py sets wall_seconds = time since this process started the run, also on a resume."""
    from common.config import validate
    from server.inprocess import run_inprocess

    cfg = validate({"num-clients": 2, "num-rounds": 2, "local-epochs": 20, "checkpoint": True,
                    "run-name": "ck", "results-dir": str(tmp_path / "results")})
    out = run_inprocess(cfg)
    first = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    run_inprocess(cfg)
    again = json.loads((out / "summary.json").read_text())
    assert again["wall_seconds"] >= sum(r["seconds"] for r in rows), (first["wall_seconds"], again["wall_seconds"])


def test_only_dp_accountings_convergence_warnings_are_dropped():
    """dp-accounting's `_compute_log_a_frac failed to converge` warnings (the order is then left out of the
    minimum: still a valid bound) flooded `privfed run` output; they are dropped wherever the accountant is
    imported, and every other absl warning (e.g. a negative Renyi divergence) still shows."""
    import logging

    import common.privacy.accounting  # noqa: F401 (installs the filter)

    def passes(msg):
        record = logging.LogRecord("absl", logging.WARNING, __file__, 1, msg, (), None)
        return bool(logging.getLogger("absl").filter(record))

    assert not passes("_compute_log_a_frac failed to converge after %d iterations with q=%f")
    assert passes("Negative Renyi divergence %f, possibly due to numerical instability")


def test_report_epsilon_notes_name_their_runs_when_they_differ():
    from rich.console import Console

    from cli.run import print_epsilon_notes

    def printed(results):
        console = Console(record=True, width=400)
        print_epsilon_notes(console, results)
        return console.export_text().strip().splitlines()

    runs = [{"path": "/r/a", "epsilon_note": "note A"}, {"path": "/r/b", "epsilon_note": "note B"},
            {"path": "/r/c", "epsilon_note": "note A"}, {"path": "/r/d", "epsilon_note": None}]
    assert printed(runs) == ["/r/a, /r/c: note A", "/r/b: note B"]
    assert printed([runs[0], runs[2], runs[3]]) == ["note A"]


def test_adult_download_without_a_network_names_the_dataset_and_its_url(capsys, tmp_path, monkeypatch):
    import urllib.error
    import urllib.request

    def offline(*args, **kwargs):
        raise urllib.error.URLError("Temporary failure in name resolution")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert main(["data", "download", "adult", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot download adult (https://" in err and "name resolution" in err, err
