"""Secure aggregation through Flower's own simulation engine (`flwr run`): one
run, 3 nodes, 2 rounds, checked several ways."""

import json

import numpy as np
import pytest

from common.config import validate
from server.flower_run import pids_with_home, run_with_flower
from server.inprocess import run_inprocess

RUN = {"num-clients": 3, "num-rounds": 2, "seed": 7, "dataset": "synthetic", "run-name": "sa",
       "secure-aggregation": True}


@pytest.fixture(scope="module")
def flower_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("fs")  # short: rich wraps the results line at 80 columns
    home = base / "flwr-home"
    code, output, results = run_with_flower({**RUN, "results-dir": str(base / "results")}, 3, flwr_home=home,
                                            timeout=300)
    return code, output, results, home


def test_secure_aggregation_under_flower_simulation(flower_run, tmp_path):
    code, output, results, home = flower_run
    assert code == 0, output[-3000:]
    assert "secure aggregation: 3 nodes enrolled" in output
    assert "dropping node" not in output and "did not reply" not in output
    rows = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]
    assert [(r["round"], r["clients"], r["secagg_survivors"], r["secagg_round_trips"]) for r in rows] == [
        (1, 3, 3, 1), (2, 3, 3, 1)]
    assert pids_with_home(home) == [], "processes started for the run are still alive"

    # the decoded sums are exact integers mod 2^32, whatever the (random) keys: the in-process
    # engine with secure aggregation gives bit-identical models, plaintext FedAvg the same within the codec step
    secure = run_inprocess(validate({**RUN, "results-dir": str(tmp_path), "run-name": "sa2"}))
    plain = run_inprocess(validate({**RUN, "secure-aggregation": False, "results-dir": str(tmp_path),
                                    "run-name": "plain"}))
    theirs, ours, ref = (np.load(p / "model.npz") for p in (results, secure, plain))
    for key in theirs.files:
        np.testing.assert_array_equal(theirs[key], ours[key])
        assert np.abs(theirs[key] - ref[key]).max() < 1e-4
    ours_rows = [json.loads(x) for x in (secure / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(rows, ours_rows, strict=True):
        assert a["accuracy"] == b["accuracy"] and a["bytes_up"] == b["bytes_up"]
