"""End to end through Flower's real simulation engine (`flwr run`), and parity
with the in-process engine on the same config and seed."""

import json

import numpy as np
import pytest

from common.config import validate
from server.flower_run import pids_with_home, run_with_flower
from server.inprocess import run_inprocess

RUN = {"num-clients": 3, "num-rounds": 3, "seed": 3, "dataset": "synthetic", "run-name": "e2e"}


@pytest.fixture(scope="module")
def flower_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("flower")
    home = base / "flwr-home"
    code, output, results = run_with_flower({**RUN, "results-dir": str(base / "results")}, 3, flwr_home=home,
                                            timeout=600)
    return code, output, results, home


def test_flower_simulation_end_to_end(flower_run):
    code, output, results, home = flower_run
    assert code == 0, output[-3000:]
    assert results is not None and results.is_dir(), output[-3000:]
    rows = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["clients"] == 3 and r["bytes_up"] > 0 and r["bytes_down"] > 0 for r in rows)
    summary = json.loads((results / "summary.json").read_text())
    assert summary["final"]["accuracy"] > summary["initial"]["accuracy"] + 0.1
    assert summary["versions"]["flwr"].startswith("1.4")
    assert (results / "accuracy.png").stat().st_size > 1000
    assert output.rstrip().splitlines()[-1].startswith("privfed: results in") or "privfed: results in" in output
    assert pids_with_home(home) == [], "processes started for the run are still alive"


def test_inprocess_matches_flower_simulation(flower_run, tmp_path):
    code, output, results, _ = flower_run
    assert code == 0, output[-3000:]
    ours = run_inprocess(validate({**RUN, "results-dir": str(tmp_path)}))
    theirs_rows = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]
    ours_rows = [json.loads(x) for x in (ours / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(ours_rows, theirs_rows, strict=True):
        for key in ("round", "clients", "bytes_up", "bytes_down"):
            assert a[key] == b[key]
        for key in ("accuracy", "loss", "train_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6)
    model_a, model_b = np.load(ours / "model.npz"), np.load(results / "model.npz")
    assert model_a.files == model_b.files
    for key in model_a.files:
        np.testing.assert_allclose(model_a[key], model_b[key], rtol=1e-5, atol=1e-6)
