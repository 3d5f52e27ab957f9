"""Checkpoint and resume (server/checkpoint.py) on the in-process engine.

An interrupted run (2 rounds, checkpointed) resumed under a new Flower run id
to 3 rounds ends where the uninterrupted 3-round run ends: same model, same
per-round rows, same epsilon in the mirror, and every client's ledger holds
exactly 3 rounds of DP-SGD steps (continued, not fresh, and not doubled).
"""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

import client.node
from client.privacy import ledger_path
from common.config import ConfigError, validate
from common.privacy.ledger import PrivacyLedger
from server.checkpoint import CheckpointError, Checkpointer, load_checkpoint, save_checkpoint
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation

STEPS = 2


def config(tmp_path, name, **extra):
    return validate({"num-clients": 3, "num-rounds": 3, "strategy": "fedavgm", "privacy": "dpsgd",
                     "local-steps": STEPS, "dp-sample-rate": 0.2, "dp-noise-multiplier": 1.0, "lr": 0.5,
                     "results-dir": str(tmp_path / "results"), "run-name": name, **extra})


class Killed(RuntimeError):
    pass


class DiesAfter:
    """Delegates to the in-process grid; the server "dies" when it sends training round `after + 1`."""

    def __init__(self, inner, after: int):
        self.inner, self.left = inner, after

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            if self.left == 0:
                raise Killed("ServerApp killed")
            self.left -= 1
        return self.inner.send_and_receive(messages, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(cfg, run_id, die_after: int | None = None):
    client.node._local.clear()  # each run: fresh client processes
    with InProcessGrid("client.app:app", dict(cfg), int(cfg["num-clients"]), run_id=run_id) as grid:
        if die_after is None:
            return run_federation(grid, cfg)
        with pytest.raises(Killed):
            run_federation(DiesAfter(grid, die_after), cfg)


def rows(results):
    return [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]


def test_file_round_trip(tmp_path):
    rec = ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3))})
    state = {"round": 2, "model": rec, "levels": [{"retired": {1, 2}, "rho": {0: 0.5, 3: 1.5},
                                                   "m": [np.ones(3)], "pair": (1, "a"), "none": None}]}
    path = save_checkpoint(tmp_path / "c" / "x.ckpt.npz", state)
    assert [p.name for p in path.parent.iterdir()] == ["x.ckpt.npz"]  # no temp file left
    back = load_checkpoint(path)
    assert back["round"] == 2 and back["model"]["w"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    level = back["levels"][0]
    assert level["retired"] == {1, 2} and level["rho"] == {0: 0.5, 3: 1.5} and level["pair"] == (1, "a")
    assert np.array_equal(level["m"][0], np.ones(3)) and level["none"] is None


def test_checkpoint_needs_run_name(tmp_path):
    with pytest.raises(ConfigError, match="run-name"):
        Checkpointer(validate({"checkpoint": True}))


def test_resume_equals_uninterrupted_run_without_double_counting(tmp_path):
    whole = run(config(tmp_path, "whole"), run_id=1)

    resumed_cfg = config(tmp_path, "part", checkpoint=True)
    run(resumed_cfg, run_id=2, die_after=2)  # killed in round 3: the checkpoint holds round 2
    resumed = run(resumed_cfg, run_id=3)  # a restarted ServerApp is a new Flower run

    a, b = rows(whole), rows(resumed)
    assert [r["round"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        for key in ("accuracy", "loss", "epsilon_max", "epsilon_mean"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-7), (ra["round"], key)
    ma, mb = np.load(whole / "model.npz"), np.load(resumed / "model.npz")
    for key in ma.files:
        np.testing.assert_allclose(mb[key], ma[key], rtol=1e-5, atol=1e-6)

    for p in range(3):  # the clients' ledgers continued under the run-name: 3 rounds, not 2 or 5
        ledger = PrivacyLedger.load(ledger_path(resumed_cfg, {}, 3, p))
        assert ledger.steps() == 3 * STEPS
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["privacy"]["ledgers"]["0"]["steps"] == 3 * STEPS  # the mirror: restored, not re-counted

    with pytest.raises(CheckpointError, match="different run config"):
        run(resumed_cfg.replace(lr=0.25), run_id=4)


@pytest.mark.parametrize("strategy,upcycled", [("fedyogi", True)])
def test_stateful_strategies_resume_exactly(tmp_path, strategy, upcycled):
    """Server state (FedYogi's moments, Upcycled's last two models) survives the checkpoint:
    interrupted in round 5 and resumed = uninterrupted 5 rounds. (Client-side state kept in
    Flower's Context.state, e.g. SCAFFOLD's c_i, is per Flower run and does not survive a restart.)"""
    base = {"strategy": strategy, "upcycled": upcycled, "privacy": "none", "local-steps": 0, "num-rounds": 5}
    whole = run(config(tmp_path, "whole", **base), run_id=1)
    part = config(tmp_path, "part", checkpoint=True, **base)
    run(part, run_id=2, die_after=2)  # upcycled: clients train in rounds 1, 3, 5; dies in round 5
    resumed = run(part, run_id=3)
    assert [r["round"] for r in rows(resumed)] == [1, 2, 3, 4, 5]
    ma, mb = np.load(whole / "model.npz"), np.load(resumed / "model.npz")
    for key in ma.files:
        np.testing.assert_allclose(mb[key], ma[key], rtol=1e-5, atol=1e-6)
