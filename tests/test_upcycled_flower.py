"""Upcycled SCAFFOLD through Flower's real simulation engine (`flwr run`):
node state (control variates) persists across rounds there too, even rounds
send nothing, and the in-process engine gives the same run. Slow: excluded
from the default test command (`-m slow` runs it)."""

import json

import numpy as np
import pytest

from common.config import validate
from server.flower_run import pids_with_home, run_with_flower
from server.inprocess import run_inprocess

RUN = {"num-clients": 3, "num-rounds": 4, "seed": 5, "dataset": "synthetic", "strategy": "scaffold",
       "upcycled": True, "upcycled-theta": 0.5, "stragglers": 0.5, "local-epochs": 3, "run-name": "upc-scaffold"}


@pytest.mark.slow
def test_upcycled_scaffold_flower_simulation_matches_inprocess(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("upf")  # short: the results line of the run's output is parsed
    home = tmp_path / "flwr-home"
    code, output, results = run_with_flower({**RUN, "results-dir": str(tmp_path / "f")}, 3, flwr_home=home,
                                            timeout=600)
    assert code == 0, output[-3000:]
    theirs = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients"] for r in theirs] == [3, 0, 3, 0]
    assert all(r["bytes_down"] == r["bytes_up"] == 0 for r in theirs[1::2])
    ours_dir = run_inprocess(validate({**RUN, "results-dir": str(tmp_path / "ours")}))
    ours = [json.loads(x) for x in (ours_dir / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(ours, theirs, strict=True):
        for key in ("round", "clients", "bytes_up", "bytes_down"):
            assert a[key] == b[key]
        assert a["accuracy"] == pytest.approx(b["accuracy"], rel=1e-5, abs=1e-6)
    model_a, model_b = np.load(ours_dir / "model.npz"), np.load(results / "model.npz")
    for key in model_a.files:
        np.testing.assert_allclose(model_a[key], model_b[key], rtol=1e-5, atol=1e-6)
    assert pids_with_home(home) == []
