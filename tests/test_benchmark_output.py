"""Benchmarks print their ratios for people and end with one JSON line of real (uncached) figures."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_dpsgd_benchmark_times_real_accounting_and_ends_with_json(capsys, monkeypatch):
    """Each timed epsilon is computed afresh (the accountants' caches would make repeats
    cache hits), and the last output line is the JSON of the figures."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import dpsgd_step
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from common.privacy import accounting

    composed = []
    real = accounting.pld_privacy_accountant.PLDAccountant

    class Counting(real):
        def compose(self, event, count=1):
            composed.append(event)
            return super().compose(event, count)

    monkeypatch.setattr(accounting.pld_privacy_accountant, "PLDAccountant", Counting)
    assert dpsgd_step.main(["--skip-steps"]) == 0
    assert len(composed) == 3  # one full PLD computation per timed repeat
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert result["benchmark"] == "dpsgd_step"
    assert {r["accountant"] for r in result["accounting"]} >= {"rdp/balle", "pld"}


def test_secagg_benchmark_prints_the_ratio_before_its_json(capsys, monkeypatch, tmp_path):
    """The ratios are printed for people, not only inside the final JSON line (child runs faked)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import secagg_vs_secaggplus as bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def fake_run(cmd, **kwargs):
        out = Path(cmd[cmd.index("--out") + 1])
        (out / "server.json").write_text("{}")
        return Done()

    seconds = {"plain": 0.1, "ours": 0.2, "secaggplus": 1.0}

    def fake_summarize(mode, dim, out_dir, clients):
        return {"mode": mode, "dim": dim, "s_per_round": seconds[mode], "s_per_round_min": 0.0,
                "s_per_round_max": 0.0, "server_cpu_s": 0.01, "client_cpu_s": 0.01, "bytes_up": 4.1 * dim,
                "bytes_down": 4.0 * dim, "round_trips": 1.0, "max_abs_err": 0.0}

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setattr(bench, "summarize", fake_summarize)
    assert bench.main(["--quick"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1])["speedup_vs_secaggplus"] == pytest.approx(5.0)
    assert "ratio" in lines[-2] and "5.00x" in lines[-2]
