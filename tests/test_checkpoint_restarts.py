"""Restarts and the files beside a checkpoint (from a review of the checkpoint journal and the lineage
claim): a restart after a lost first round plans from what the clients spent, and no two run-names share
a journal or an in-flight record."""

from __future__ import annotations

import json

import pytest

import client.node
from client.privacy import ledger_path
from common.config import validate
from common.privacy.accounting import ali_epsilon
from common.privacy.ledger import PrivacyLedger
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation
from fault_grids import DiesAfter, Killed

Q, SIGMA, DELTA, CLIENTS = 0.2, 1.0, 1e-5, 3


def _rows(results):
    return [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]


# --- 1. a restart after a round lost before the first checkpoint (the round-0 checkpoint) ---------------
def test_ali_restart_after_a_lost_first_round_counts_that_round_in_t(tmp_path, one_torch_thread):
    """ALI-DPFL with R_c = 5 steps (tau = 1 per round). The first start dies after round 1's replies, before
    any checkpoint: every client's ledger holds 1 step. The restart continues that start (in-flight record,
    round-0 checkpoint, same lineage) and its mirror counts the step, but its t does not (the runner calls
    `sync_with_mirror` only when a checkpoint was resumed): it plans 5 more rounds of tau = 1, and in the
    5th every client refuses (budget spent), a round in which nothing is usable. A resume from a real
    checkpoint syncs t and plans only what the clients have left: so must this restart (4 rounds)."""
    target = ali_epsilon(5, Q, SIGMA, DELTA) * 1.001
    cfg = validate({"strategy": "ali-dpfl", "num-clients": CLIENTS, "num-rounds": 8, "privacy": "dpsgd",
                    "dp-sample-rate": Q, "dp-noise-multiplier": SIGMA, "dp-clip": 1.0,
                    "lr": 0.1, "target-epsilon": target, "target-delta": DELTA, "accountant": "ali-eq12",
                    "results-dir": str(tmp_path), "run-name": "ali", "synthetic-dim": 10, "checkpoint": True})
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), CLIENTS, run_id=1) as grid:
        with pytest.raises(Killed):
            run_federation(DiesAfter(grid, 1, after_replies=True), cfg)
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), CLIENTS, run_id=2) as grid:
        results = run_federation(grid, cfg)
    for p in range(CLIENTS):
        assert PrivacyLedger.load(ledger_path(cfg, {}, 2, p)).steps() == 5  # 1 (lost round) + 4
    taus = [r["ali_tau"] for r in _rows(results)]
    assert sum(taus) == 4, taus  # measured: [1, 1, 1, 1, 1], the 5th refused by every client


# --- 2. the file names beside the checkpoint ---------------------------------------------------------------
def test_two_run_names_never_share_a_checkpoint_journal_or_inflight_record(tmp_path):
    """`journal_path` and `inflight_path` are the checkpoint's name with EVERY '.ckpt.npz' replaced, so two
    valid run-names share one file: 'x.ckpt.npz' and 'x.journal.jsonl' both get the journal
    'x.journal.jsonl.journal.jsonl' (each run's save truncates it at its own length and appends its own
    line: the other run's checkpoint no longer matches its digest and can never be resumed), and
    'x.ckpt.npz' and 'x.inflight.npz' both get the in-flight record 'x.inflight.npz.inflight.npz' (one
    run's begin_round overwrites the other's record of a round its clients may have charged; that run's
    resume then reads another lineage's record and leaves the round out of its epsilon). The suffix must
    be replaced once, at the end."""
    from server.checkpoint import Checkpointer

    def paths(name):
        c = Checkpointer(validate({"checkpoint": True, "run-name": name, "results-dir": str(tmp_path)}))
        return c.path, c.journal_path, c.inflight_path

    a, b, c = paths("x.ckpt.npz"), paths("x.journal.jsonl"), paths("x.inflight.npz")
    assert len({a[0], b[0], c[0]}) == 3  # three checkpoints
    assert a[1] != b[1], a[1].name  # measured: both x.journal.jsonl.journal.jsonl
    assert a[2] != c[2], a[2].name  # measured: both x.inflight.npz.inflight.npz
    assert (a[1].name, a[2].name) == ("x.ckpt.npz.journal.jsonl", "x.ckpt.npz.inflight.npz")


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_a_kill_after_round_1s_row_before_its_checkpoint_resumes(tmp_path, monkeypatch):
    """A SIGKILL fuzz hit the gap between round 1's metrics row (and journal line) and its first .ckpt.npz: the
    same command again was refused, "results folder ... already holds a run; choose another run-name", so the
    documented recovery (count the lost round from the in-flight record) never ran, and the advice abandoned
    the run-name's charged ledgers."""
    import server.checkpoint

    cfg = validate({"num-clients": 3, "num-rounds": 2, "privacy": "dpsgd", "local-steps": 2, "dp-sample-rate": 0.2,
                    "lr": 0.5, "dp-noise-seed": "run-seed", "checkpoint": True, "target-epsilon": 50.0,
                    "results-dir": str(tmp_path / "results"), "run-name": "x"})
    real_save = server.checkpoint.save_checkpoint

    def dies_on_first_checkpoint(path, state, *args, **kwargs):
        if str(path).endswith(".ckpt.npz"):
            raise Killed("after the journal line, before the checkpoint landed")
        return real_save(path, state, *args, **kwargs)

    def start(run_id):
        client.node._local.clear()  # each start: fresh client processes
        with InProcessGrid("client.app:app", dict(cfg), 3, run_id=run_id) as grid:
            return run_federation(grid, cfg)

    monkeypatch.setattr(server.checkpoint, "save_checkpoint", dies_on_first_checkpoint)
    with pytest.raises(Killed):
        start(1)
    monkeypatch.setattr(server.checkpoint, "save_checkpoint", real_save)
    assert (tmp_path / "results" / "x" / "metrics.jsonl").read_text().strip()  # round 1's row
    assert (tmp_path / "results" / "checkpoints" / "x.inflight.npz").exists()
    results = start(2)
    assert [r["round"] for r in _rows(results)] == [1, 2]
    summary = json.loads((results / "summary.json").read_text())
    ledgers = [PrivacyLedger.load(ledger_path(cfg, {}, 2, p)) for p in range(3)]
    assert [lg.steps() for lg in ledgers] == [6] * 3  # the lost round 1, round 1 again, round 2
    assert [summary["privacy"]["ledgers"][str(p)]["steps"] for p in range(3)] == [6] * 3  # the mirror counts it
