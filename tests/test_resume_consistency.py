"""Checkpoint / resume / crash consistency: one test per defect an adversarial review found (session 11).

Each drives the in-process engine like tests/test_checkpoint.py: a run "killed" at a chosen point, then
restarted under a new Flower run id, and checks that no results are lost and that no epsilon is
under-counted (the server's mirror >= every client's ledger; no client past its target-epsilon)."""

import json
import re

import numpy as np
import pytest

import client.node
from client.privacy import ledger_path
from common.checkpoint_file import CheckpointError
from common.config import ConfigError, validate
from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger
from server.checkpoint import Checkpointer
from server.inprocess_grid import InProcessGrid
from server.privacy_mirror import PrivacyMirror
from server.results import ResultsWriter
from server.roster import Roster
from server.runner import run_federation
from server.strategies.registry import build_strategy

STEPS = 2


def config(tmp_path, **extra):
    return validate({"num-clients": 3, "num-rounds": 3, "strategy": "fedavgm", "privacy": "dpsgd",
                     "local-steps": STEPS, "dp-sample-rate": 0.2, "dp-noise-multiplier": 1.0, "lr": 0.5,
                     "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state"),
                     "run-name": "r", "checkpoint": True, **extra})


class Killed(RuntimeError):
    pass


class DiesAfter:
    """The server "dies" when it sends training round `after + 1` (`after_replies`: once the replies
    of training round `after` are in, before that round is checkpointed)."""

    def __init__(self, inner, after: int, after_replies: bool = False):
        self.inner, self.left, self.after_replies = inner, after, after_replies

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            if self.left == 0 and not self.after_replies:
                raise Killed("ServerApp killed")
            self.left -= 1
            if self.left == 0 and self.after_replies:
                self.inner.send_and_receive(messages, timeout=timeout)
                raise Killed("ServerApp killed")
        return self.inner.send_and_receive(messages, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(cfg, run_id, die_after=None, after_replies=False):
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), int(cfg["num-clients"]), run_id=run_id) as grid:
        if die_after is None:
            return run_federation(grid, cfg)
        with pytest.raises(Killed):
            run_federation(DiesAfter(grid, die_after, after_replies), cfg)


def client_steps(cfg, partition):
    return PrivacyLedger.load(ledger_path(cfg, {}, 0, partition)).steps()


def mirror_steps(results):
    ledgers = json.loads((results / "summary.json").read_text())["privacy"]["ledgers"]
    return {int(p): led["steps"] for p, led in ledgers.items()}


def test_a_crash_in_round_1_is_counted_in_the_mirror(tmp_path):
    """The clients charged round 1, the server died before its first checkpoint: the in-flight record
    exists, but with no checkpoint the restart is a fresh start that ignores it, so the printed epsilon
    counts fewer rounds than every client's ledger holds."""
    cfg = config(tmp_path)
    run(cfg, 1, die_after=1, after_replies=True)
    assert Checkpointer(cfg).inflight_path.exists()
    resumed = run(cfg, 2)
    mirrored = mirror_steps(resumed)
    for p in range(3):
        assert mirrored[p] >= client_steps(cfg, p), (p, mirrored[p], client_steps(cfg, p))


def test_a_moved_checkpoint_dir_neither_wipes_the_results_nor_undercounts(tmp_path):
    """checkpoint-dir is a key that 'may change' on resume; changed, the checkpoint is not found and the
    run silently starts afresh: metrics.jsonl of the interrupted run is overwritten, and the mirror
    restarts from zero while the clients' ledgers (keyed by run-name) continue."""
    cfg = config(tmp_path, **{"num-rounds": 4})
    run(cfg, 1, die_after=2)
    metrics = tmp_path / "results" / "r" / "metrics.jsonl"
    before = metrics.read_text()
    assert len(before.splitlines()) == 2
    moved = cfg.replace(**{"checkpoint-dir": str(tmp_path / "elsewhere")})
    try:
        results = run(moved, 2)
    except (CheckpointError, ConfigError):  # the correct outcome: a clear refusal, nothing lost
        assert metrics.read_text() == before
        return
    mirrored = mirror_steps(results)  # or, if it runs, at least no under-count and no lost rows
    assert all(mirrored[p] >= client_steps(moved, p) for p in range(3)), (mirrored, client_steps(moved, 0))
    assert metrics.read_text().startswith(before)


def test_a_changed_state_dir_on_resume_does_not_reset_the_client_budget(tmp_path):
    """state-dir 'may change' on resume; the nodes then open fresh, empty ledgers and accept rounds past
    target-epsilon: 2 rounds charged in the old folder + 3 in the new one = 5 rounds, while the budget
    (5.0) allows 3."""
    old = config(tmp_path, **{"num-rounds": 6, "target-epsilon": 5.0})
    run(old, 1, die_after=2)  # rounds 1, 2 trained and checkpointed; killed as round 3 leaves
    new = old.replace(**{"state-dir": str(tmp_path / "moved")})
    try:
        run(new, 2)
    except (CheckpointError, ConfigError):  # refusing the resume is fine too
        pass
    for p in range(3):
        entries = PrivacyLedger.load(ledger_path(old, {}, 0, p)).entries
        moved = ledger_path(new, {}, 0, p)
        if moved.exists():
            entries += PrivacyLedger.load(moved).entries
        spent = PrivacyLedger(entries).epsilon(1e-5)
        assert spent <= 5.0, f"partition {p} released {len(entries)} rounds: epsilon {spent:.3f} > target 5.0"


ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})


def test_a_damaged_mirror_ledger_in_the_checkpoint_is_refused_before_any_round(tmp_path):
    """A mirror entry with steps 'x' (or a missing sample_rate) passes the resume; the resumed round is
    then sent, the clients charge it, and the server crashes computing epsilon (ValueError: invalid
    literal for int()) - every retry spends another round."""
    cfg = config(tmp_path)
    strategy = build_strategy(cfg, ROSTER, lambda *_: None)
    mirror, writer = PrivacyMirror(cfg, ROSTER.partitions), ResultsWriter(cfg["results-dir"], "r")
    mirror.record(0, [dpsgd_steps(0.2, 1.0, STEPS, round=1)])
    writer.add_round({"round": 1, "accuracy": 0.5, "loss": 1.0})
    checkpointer = Checkpointer(cfg, lambda *_: None)
    from flwr.app import Array, ArrayRecord
    checkpointer.save(1, ArrayRecord({"w": Array(np.zeros(3, np.float32))}), strategy, mirror, writer)
    path = checkpointer.path
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["__meta__"].tobytes().decode())
    meta["__dict__"]["mirror"]["__dict__"]["0"]["__dict__"]["entries"][0]["__dict__"]["params"]["__dict__"]["steps"] = "x"
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    fresh = build_strategy(cfg, ROSTER, lambda *_: None), PrivacyMirror(cfg, ROSTER.partitions), \
        ResultsWriter(cfg["results-dir"], "r")
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        Checkpointer(cfg, lambda *_: None).resume(*fresh)


def test_a_damaged_inflight_record_is_not_advised_away(tmp_path):
    """The in-flight record of a lost round is damaged: the refusal says 'delete it ... to start the run
    afresh'; deleting it resumes (not afresh) without that round, and the mirror then under-counts every
    client's ledger. The dedicated message in _charge_lost_round is never reached."""
    cfg = config(tmp_path)
    run(cfg, 1, die_after=2, after_replies=True)  # round 2 charged by the clients, not checkpointed
    inflight = Checkpointer(cfg).inflight_path
    inflight.write_bytes(inflight.read_bytes()[:50])
    with pytest.raises(CheckpointError) as refused:
        run(cfg, 2)
    text = str(refused.value)
    assert "round 2" in text, text  # names the round whose privacy cannot be accounted
    assert "delete it" not in text, text  # deleting it would drop that round from the mirror


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2],  # truncated JSON
    lambda text: json.dumps({**json.loads(text), "entries": [{"kind": "dpsgd"}]}),  # an entry without params
])
def test_a_damaged_client_ledger_is_refused_by_name(tmp_path, damage):
    """A node's ledger file damaged: JSONDecodeError 'Expecting value: line 1 column 1' / KeyError
    'params', naming neither the file nor what to do (checkpoints and snapshots name theirs)."""
    path = tmp_path / "name-r" / "partition-0.ledger.json"
    ledger = PrivacyLedger.open(path, owner="partition-0")
    ledger.record(dpsgd_steps(0.2, 1.0, STEPS, round=1))
    path.write_text(damage(path.read_text()))
    with pytest.raises(ValueError, match=re.escape(str(path))):
        PrivacyLedger.open(path, owner="partition-0")
