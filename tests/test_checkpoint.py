"""Checkpoint and resume (server/checkpoint.py) on the in-process engine.

An interrupted run (2 rounds, checkpointed) resumed under a new Flower run id
to 3 rounds ends where the uninterrupted 3-round run ends: same model, same
per-round rows, same epsilon in the mirror, and every client's ledger holds
exactly 3 rounds of DP-SGD steps (continued, not fresh, and not doubled).
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict

import client.node
from client import resume
from client.privacy import ledger_path
from common.config import ConfigError, drop_unread, validate
from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger
from server.checkpoint import CheckpointError, Checkpointer, load_checkpoint, save_checkpoint
from server.inprocess_grid import InProcessGrid
from server.privacy_mirror import PrivacyMirror
from server.results import ResultsWriter
from server.roster import Roster
from server.runner import run_federation
from server.strategies.registry import build_strategy
from fault_grids import DiesAfter, Killed
from test_checkpoint_damage import rewrite_journal

STEPS = 2


def config(tmp_path, name, **extra):
    return validate(drop_unread({"num-clients": 3, "num-rounds": 3, "strategy": "fedavgm", "privacy": "dpsgd",
                                 "local-steps": STEPS, "dp-sample-rate": 0.2, "dp-noise-multiplier": 1.0, "lr": 0.5,
                                 "dp-noise-seed": "run-seed",  # resumed and uninterrupted runs compared bit for bit
                                 "results-dir": str(tmp_path / "results"), "run-name": name}, extra))


def run(cfg, run_id, die_after: int | None = None, after_replies: bool = False):
    client.node._local.clear()  # each run: fresh client processes
    with InProcessGrid("client.app:app", dict(cfg), int(cfg["num-clients"]), run_id=run_id) as grid:
        if die_after is None:
            return run_federation(grid, cfg)
        with pytest.raises(Killed):
            run_federation(DiesAfter(grid, die_after, after_replies), cfg)


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
        keys = ("accuracy", "loss") + (("epsilon_max", "epsilon_mean") if ra["round"] < 3 else ())
        for key in keys:
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-7), (ra["round"], key)
    ma, mb = np.load(whole / "model.npz"), np.load(resumed / "model.npz")
    for key in ma.files:
        np.testing.assert_allclose(mb[key], ma[key], rtol=1e-5, atol=1e-6)

    for p in range(3):  # the clients' ledgers continued under the run-name: 3 rounds, not 2 or 5
        ledger = PrivacyLedger.load(ledger_path(resumed_cfg, {}, 3, p))
        assert ledger.steps() == 3 * STEPS
    summary = json.loads((resumed / "summary.json").read_text())
    # the mirror: restored, not re-counted; the server died as round 3's instructions were leaving, and
    # the nodes' enrollment reports show that none arrived (server/lost_round.py): not counted either
    assert summary["privacy"]["ledgers"]["0"]["steps"] == 3 * STEPS
    assert b[-1]["epsilon_max"] == pytest.approx(a[-1]["epsilon_max"], rel=1e-12)

    with pytest.raises(CheckpointError, match="different run config"):
        run(resumed_cfg.replace(lr=0.25), run_id=4)
    path = Checkpointer(resumed_cfg).path
    save_checkpoint(path, {**load_checkpoint(path), "version": 1})
    with pytest.raises(CheckpointError, match="format version 1"):
        run(resumed_cfg, run_id=5)


def test_a_round_lost_after_the_clients_trained_is_in_the_mirror_as_in_their_ledgers(tmp_path):
    """The clients charged and released round 3, then the server died before checkpointing it: the
    re-run round 3 is charged again by the clients, and the resumed mirror must count both."""
    cfg = config(tmp_path, "lost", checkpoint=True)
    run(cfg, run_id=2, die_after=3, after_replies=True)
    resumed = run(cfg, run_id=3)
    for p in range(3):
        assert PrivacyLedger.load(ledger_path(cfg, {}, 3, p)).steps() == 4 * STEPS
    ledgers = json.loads((resumed / "summary.json").read_text())["privacy"]["ledgers"]
    assert [ledgers[str(p)]["steps"] for p in range(3)] == [4 * STEPS] * 3
    assert not Checkpointer(cfg).inflight_path.exists()


def assert_same_model(a, b):
    ma, mb = np.load(a / "model.npz"), np.load(b / "model.npz")
    for key in ma.files:
        np.testing.assert_allclose(mb[key], ma[key], rtol=1e-5, atol=1e-6)


STATEFUL = {"privacy": "none", "local-steps": 0, "num-rounds": 5}


@pytest.mark.parametrize("strategy,upcycled", [("fedyogi", True), ("scaffold", True), ("feddyn", False)])
def test_stateful_strategies_resume_exactly(tmp_path, strategy, upcycled):
    """Server state (FedYogi's moments, SCAFFOLD's c, Upcycled's last two models) and the nodes'
    update-rule state (SCAFFOLD's c_i, FedDyn's g_i: client/resume.py) survive
    the restart: interrupted in round 5 and resumed = uninterrupted 5 rounds."""
    base = {"strategy": strategy, "upcycled": upcycled, **STATEFUL}
    whole = run(config(tmp_path, "whole", **base), run_id=1)
    part = config(tmp_path, "part", checkpoint=True, **base)
    run(part, run_id=2, die_after=2 if upcycled else 4)  # upcycled: clients train in rounds 1, 3, 5
    resumed = run(part, run_id=3)
    assert [r["round"] for r in rows(resumed)] == [1, 2, 3, 4, 5]
    assert_same_model(whole, resumed)


def test_node_state_of_a_lost_round_is_not_restored(tmp_path):
    """The server dies after its round-3 replies but before checkpointing round 3: the nodes'
    round-3 snapshots exist, yet the resumed round 3 must start from their earlier state."""
    base = {"strategy": "scaffold", "num-clients": 4, "fraction-train": 0.5, **STATEFUL}
    whole = run(config(tmp_path, "whole", **base), run_id=1)
    part = config(tmp_path, "part", checkpoint=True, **base)
    run(part, run_id=2, die_after=3, after_replies=True)
    assert load_checkpoint(Checkpointer(part).path)["round"] == 2
    resumed = run(part, run_id=3)
    assert_same_model(whole, resumed)


def test_fresh_start_under_the_same_run_name_ignores_old_node_state(tmp_path):
    """A new lineage (checkpoint deleted, same run-name) must not restore an earlier run's c_i."""
    base = {"strategy": "scaffold", "num-clients": 4, "fraction-train": 0.5, **STATEFUL}
    whole = run(config(tmp_path, "whole", **base), run_id=1)
    part = config(tmp_path, "part", checkpoint=True, **base)
    run(part, run_id=2, die_after=4)
    Checkpointer(part).path.unlink()
    shutil.rmtree(Path(part["results-dir"]) / "part")  # else the fresh start refuses the folder of the run
    again = run(part, run_id=3)
    assert_same_model(whole, again)


def test_snapshots_are_kept_per_lineage_and_bounded(tmp_path):
    state = RecordDict({"c": ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})})
    for r in (1, 3, 4):
        state["c"] = ArrayRecord({"w": Array(np.full(2, r, dtype=np.float32))})
        resume.save(tmp_path, "ab", r, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ab-round-00000003.npz", "ab-round-00000004.npz"]
    fresh = RecordDict()
    assert resume.restore(tmp_path, "ab", 4, fresh) == 3 and fresh["c"]["w"].numpy().tolist() == [3, 3]
    assert resume.restore(tmp_path, "cd", 9, RecordDict()) is None  # another lineage's: not ours
    resume.save(tmp_path, "cd", 1, state)
    assert [p.name for p in tmp_path.iterdir()] == ["cd-round-00000001.npz"]  # the old lineage is gone
    with pytest.raises(ValueError, match="hex token"):
        resume.restore(tmp_path, "../x", 2, RecordDict())
    with pytest.raises(ValueError, match="hex token"):
        resume.save(tmp_path, "../x", 2, state)
    assert not (tmp_path.parent / "x-round-00000002.npz").exists()


# --- crash consistency (an adversarial review, session 11) ------------------------------------
def resumable(tmp_path, **extra):
    return validate(drop_unread({"num-clients": 3, "num-rounds": 3, "strategy": "fedavgm", "privacy": "dpsgd",
                                 "local-steps": STEPS, "dp-sample-rate": 0.2, "dp-noise-multiplier": 1.0, "lr": 0.5,
                                 "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state"),
                                 "run-name": "r", "checkpoint": True}, extra))


def client_steps(cfg, partition):
    return PrivacyLedger.load(ledger_path(cfg, {}, 0, partition)).steps()


def mirror_steps(results):
    ledgers = json.loads((results / "summary.json").read_text())["privacy"]["ledgers"]
    return {int(p): led["steps"] for p, led in ledgers.items()}


def test_a_crash_in_round_1_is_counted_in_the_mirror(tmp_path):
    """The clients charged round 1, the server died before its first checkpoint: the in-flight record
    exists, but with no checkpoint the restart is a fresh start that ignores it, so the printed epsilon
    counts fewer rounds than every client's ledger holds."""
    cfg = resumable(tmp_path)
    run(cfg, 1, die_after=1, after_replies=True)
    assert Checkpointer(cfg).inflight_path.exists()
    resumed = run(cfg, 2)
    mirrored = mirror_steps(resumed)
    for p in range(3):
        assert mirrored[p] >= client_steps(cfg, p), (p, mirrored[p], client_steps(cfg, p))
        # the restart continues the crashed start (its lineage), so the nodes train: round 1 twice, then 2, 3
        assert client_steps(cfg, p) == 4 * STEPS


def test_a_moved_checkpoint_dir_neither_wipes_the_results_nor_undercounts(tmp_path):
    """checkpoint-dir may change on resume; changed, the checkpoint was not found and the run silently
    started afresh: metrics.jsonl of the interrupted run overwritten, and the mirror restarted from zero
    while the clients' ledgers (keyed by run-name) continued. Now the results folder is refused."""
    cfg = resumable(tmp_path, **{"num-rounds": 4})
    run(cfg, 1, die_after=2)
    metrics = tmp_path / "results" / "r" / "metrics.jsonl"
    before = metrics.read_text()
    assert len(before.splitlines()) == 2
    with pytest.raises(ConfigError, match="already holds a run"):
        run(cfg.replace(**{"checkpoint-dir": str(tmp_path / "elsewhere")}), 2)
    assert metrics.read_text() == before


def test_a_changed_state_dir_on_resume_is_refused(tmp_path):
    """state-dir could change on resume; the nodes then opened fresh, empty ledgers and accepted rounds
    past target-epsilon (2 rounds charged in the old folder + 3 in the new one, where the budget allows 3)."""
    old = resumable(tmp_path, **{"num-rounds": 6, "target-epsilon": 5.0})
    run(old, 1, die_after=2)  # rounds 1, 2 trained and checkpointed; killed as round 3 leaves
    new = old.replace(**{"state-dir": str(tmp_path / "moved")})
    with pytest.raises(CheckpointError, match="state-dir"):
        run(new, 2)
    assert not ledger_path(new, {}, 0, 0).exists()


ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})


def test_a_damaged_mirror_ledger_in_the_checkpoint_is_refused_before_any_round(tmp_path):
    """A mirror entry with steps 'x' (or a missing sample_rate) passes the resume; the resumed round is
    then sent, the clients charge it, and the server crashes computing epsilon (ValueError: invalid
    literal for int()) - every retry spends another round."""
    cfg = resumable(tmp_path)
    strategy = build_strategy(cfg, ROSTER, lambda *_: None)
    mirror, writer = PrivacyMirror(cfg, ROSTER.partitions), ResultsWriter(cfg["results-dir"], "r")
    mirror.record(0, [dpsgd_steps(0.2, 1.0, STEPS, round=1)])
    writer.add_round({"round": 1, "accuracy": 0.5, "loss": 1.0})
    checkpointer = Checkpointer(cfg, lambda *_: None)
    from flwr.app import Array, ArrayRecord
    checkpointer.save(1, ArrayRecord({"w": Array(np.zeros(3, np.float32))}), strategy, mirror, writer)
    path = checkpointer.path

    def damage(lines):
        lines[0]["mirror"]["0"][0]["params"]["steps"] = "x"
        return lines
    rewrite_journal(path, damage)  # the digest matches: the entry itself must be refused
    fresh = build_strategy(cfg, ROSTER, lambda *_: None), PrivacyMirror(cfg, ROSTER.partitions), \
        ResultsWriter(cfg["results-dir"], "r")
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        Checkpointer(cfg, lambda *_: None).resume(*fresh)


def test_a_damaged_inflight_record_is_not_advised_away(tmp_path):
    """The in-flight record of a lost round is damaged: the refusal says 'delete it ... to start the run
    afresh'; deleting it resumes (not afresh) without that round, and the mirror then under-counts every
    client's ledger. The dedicated message in _charge_lost_round is never reached."""
    cfg = resumable(tmp_path)
    run(cfg, 1, die_after=2, after_replies=True)  # round 2 charged by the clients, not checkpointed
    inflight = Checkpointer(cfg).inflight_path
    inflight.write_bytes(inflight.read_bytes()[:50])
    with pytest.raises(CheckpointError) as refused:
        run(cfg, 2)
    text = str(refused.value)
    assert "round 2" in text, text  # names the round whose privacy cannot be accounted
    assert "delete it" not in text, text  # deleting it would drop that round from the mirror


def _damage_entry_line(text: str, replace) -> str:
    header, entry, *rest = text.splitlines(keepends=True)
    return header + replace(entry) + "".join(rest)


@pytest.mark.parametrize("damage", [
    # an entry line cut in half, with a whole entry after it (a cut last line would be a torn append)
    lambda text: _damage_entry_line(text + text.splitlines(keepends=True)[1],
                                    lambda line: line[: len(line) // 2] + "\n"),
    lambda text: _damage_entry_line(text, lambda line: '{"kind": "dpsgd"}\n'),  # an entry without params
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


def test_an_ali_checkpoint_written_with_the_local_steps_it_never_read_resumes():
    """Presets before session 19 set local-steps = 1 for ALI-DPFL (never read: its server sends tau), which
    validation now refuses: a checkpoint holding it was refused as 'a different run config (local-steps)',
    and the same config could no longer be given (review of session 19)."""
    from server.checkpoint import strategy_classes

    new = validate({"strategy": "ali-dpfl", "privacy": "dpsgd", "target-epsilon": 2.0})
    strategy = object()
    Checkpointer(new, lambda *_: None)._check_compatible(
        {"config": {**new, "local-steps": 1}, "strategy_classes": strategy_classes(strategy)}, strategy)


def test_resume_with_relative_state_dir_is_the_same_run_on_either_engine(tmp_path, monkeypatch, one_torch_thread):
    """(review, session 21) `privfed run ... --set state-dir=nodes --set checkpoint=true` started on --engine inprocess and resumed by
    the same command on --engine simulation (or the other way round) is the same run in the same folders; the
    simulation engine hands the ServerApp absolute_paths(overrides), whose state-dir is the resolved folder, and
    the checkpoint compares it as a string with the relative one the in-process run recorded: refused with
    "different run config (state-dir)". (Observed with the CLI: exit 2 on --engine simulation after an
    in-process start.)"""
    from cli.run import absolute_paths, run_one
    from common.config import validate

    monkeypatch.chdir(tmp_path)
    overrides = {"num-clients": 2, "num-rounds": 1, "checkpoint": True, "run-name": "sd", "state-dir": "nodes",
                 "results-dir": str(tmp_path / "results")}
    validate(overrides)
    first = run_one(overrides, engine="inprocess", quiet=True)
    # what --engine simulation passes to the ServerApp for the same command in the same folder
    again = run_one(absolute_paths(overrides), engine="inprocess", quiet=True)
    assert again == first


def test_pre_change_relative_state_dir_is_not_resolved_against_another_cwd(tmp_path, monkeypatch, one_torch_thread):
    """(review, session 21) A checkpoint written before privfed run's in-process paths were absolute records state-dir as typed ("nodes", relative to the cwd it ran in:
    its ledgers are in a/nodes). Resumed from cwd b with state-dir = b/nodes (another folder: its ledgers
    open empty, every budget reset), a first fix resolved the recorded "nodes" against b and lets it through;
    before the change the strings differed and the resume was refused."""
    from cli.run import run_one
    from common.checkpoint_file import CheckpointError
    from common.config import validate
    from server.inprocess import run_inprocess

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    overrides = {"num-clients": 2, "num-rounds": 1, "checkpoint": True, "run-name": "sd", "state-dir": "nodes",
                 "results-dir": str(tmp_path / "results")}
    monkeypatch.chdir(a)
    run_inprocess(validate(overrides), threads=1, round_lines=False)  # what run_one did before the change
    assert (a / "nodes" / "name-sd").is_dir()
    monkeypatch.chdir(b)
    with pytest.raises(CheckpointError, match="state-dir"):
        run_one({**overrides, "state-dir": str(b / "nodes")}, engine="inprocess", quiet=True)


def test_a_relative_state_dir_checkpoint_resumes_by_the_same_command_in_its_folder(tmp_path, monkeypatch,
                                                                                   one_torch_thread):
    """The checkpoint recorded state-dir as typed ("nodes"); privfed run now passes it absolute: from the folder
    the run started in, that is the same folder, holding the run's node state, and the resume goes on."""
    from cli.run import run_one
    from common.config import validate
    from server.inprocess import run_inprocess

    overrides = {"num-clients": 2, "num-rounds": 1, "checkpoint": True, "run-name": "sd", "state-dir": "nodes",
                 "results-dir": str(tmp_path / "results")}
    monkeypatch.chdir(tmp_path)
    first = run_inprocess(validate(overrides), threads=1, round_lines=False)
    assert run_one(overrides, engine="inprocess", quiet=True) == first
