"""Damaged or hostile checkpoints and node snapshots (server/checkpoint.py, common/checkpoint_file.py,
client/resume.py): one clear CheckpointError naming the file and what to do, and nothing lost, in
particular not the interrupted run's metrics.jsonl."""

import json
import os

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

import client.node
from client import resume
from common.checkpoint_file import JOURNAL_START, chain, journal_line, save_checkpoint
from common.config import validate
from server.checkpoint import CheckpointError, Checkpointer, load_auto_state
from server.inprocess_grid import InProcessGrid
from server.privacy_mirror import PrivacyMirror
from server.results import ResultsWriter
from server.roster import Roster
from server.runner import run_federation
from server.strategies.registry import build_strategy

ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})


def config(tmp_path, **extra):
    return validate({"num-clients": 3, "num-rounds": 2, "strategy": "fedavgm", "dataset": "synthetic",
                     "results-dir": str(tmp_path / "results"), "run-name": "r", "checkpoint": True, **extra})


def parts(cfg):
    strategy = build_strategy(cfg, ROSTER, lambda *_: None)
    return strategy, PrivacyMirror(cfg, ROSTER.partitions), ResultsWriter(cfg["results-dir"], "r")


def model(value):
    return ArrayRecord({"w": Array(np.full((2, 3), value, np.float32))})


@pytest.fixture
def saved(tmp_path):
    """A genuine round-1 checkpoint: (config, its path)."""
    cfg = config(tmp_path)
    strategy, mirror, writer = parts(cfg)
    writer.add_round({"round": 1, "accuracy": 0.5, "loss": 1.0})
    checkpointer = Checkpointer(cfg, lambda *_: None)
    checkpointer.save(1, model(0.3), strategy, mirror, writer)
    return cfg, checkpointer.path


def rewrite(path, change):
    """Rewrite the checkpoint's meta JSON with `change(meta)`; keep its arrays."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = change(json.loads(arrays["__meta__"].tobytes().decode()))
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def with_entry(key, value):
    return lambda meta: {"__dict__": {**meta["__dict__"], key: value}}


def rewrite_journal(path, change):
    """Rewrite the journal's lines with `change(lines)` and make the checkpoint cover them (length and
    digest): damage the digest does not catch, for the checks behind it."""
    journal = path.with_name(path.name.replace(".ckpt.npz", ".journal.jsonl"))
    data = b"".join(journal_line(line) for line in change([json.loads(x) for x in journal.read_bytes().splitlines()]))
    journal.write_bytes(data)
    digest = JOURNAL_START
    for line in data.splitlines(keepends=True):
        digest = chain(digest, line)
    rewrite(path, with_entry("journal", {"__dict__": {"bytes": len(data), "sha256": digest}}))


def object_array(path):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["amodel/w"] = np.array([{"x": 1}], dtype=object)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def hostile_attribute(meta):
    meta["__dict__"]["strategy"][0]["__dict__"]["aggregate_train"] = 1
    return meta


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(os.urandom(500)),
    "pickled object array": object_array,
    "meta is a list": lambda p: rewrite(p, lambda meta: [1, 2]),
    "round missing": lambda p: rewrite(p, lambda meta: (meta["__dict__"].pop("round"), meta)[1]),
    "round a string": lambda p: rewrite(p, with_entry("round", "x")),
    "dangling array reference": lambda p: rewrite(p, with_entry("model", {"__array__": "nope"})),
    "strategy states missing": lambda p: rewrite(p, with_entry("strategy", [])),
    "lineage not hex": lambda p: rewrite(p, with_entry("lineage", "../x")),
    "hostile attribute": lambda p: rewrite(p, hostile_attribute),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_by_name(saved, damage):
    cfg, path = saved
    DAMAGE[damage](path)
    strategy, mirror, writer = parts(cfg)
    with pytest.raises(CheckpointError, match="another run-name") as refused:
        Checkpointer(cfg, lambda *_: None).resume(strategy, mirror, writer)
    assert str(path) in str(refused.value)


def test_load_auto_state_sets_only_saved_attributes(tmp_path):
    strategy = build_strategy(config(tmp_path), ROSTER, lambda *_: None)
    with pytest.raises(CheckpointError, match=r"\['configure_train', 'roster'\]"):
        load_auto_state(strategy, {"roster": {}, "configure_train": 1})
    assert isinstance(strategy.roster, Roster) and callable(strategy.configure_train)


def test_load_auto_state_refuses_values_of_another_type_and_sets_nothing(tmp_path):
    strategy = build_strategy(config(tmp_path), ROSTER, lambda *_: None)
    with pytest.raises(CheckpointError, match=r"wrong type for \['retired', 'server_momentum'\]"):
        load_auto_state(strategy, {"seed": 5, "server_momentum": "0.9", "retired": [1]})
    assert strategy.seed != 5 and isinstance(strategy.server_momentum, float) and strategy.retired == set()
    load_auto_state(strategy, {"seed": 5, "server_momentum": 0, "momentum_vector": {"w": 1}})  # int for float
    assert strategy.seed == 5 and strategy.momentum_vector == {"w": 1}


def run(cfg, run_id):
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), 3, run_id=run_id) as grid:
        return run_federation(grid, cfg)


@pytest.mark.parametrize("refusal", ["corrupted or unreadable", "different run config"])
def test_a_failed_resume_keeps_the_results_rows(tmp_path, refusal):
    cfg = config(tmp_path, strategy="fedavg")
    metrics = run(cfg, 1) / "metrics.jsonl"
    before = metrics.read_text()
    assert len(before.splitlines()) == 2
    path = Checkpointer(cfg).path
    if refusal == "corrupted or unreadable":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        cfg = cfg.replace(lr=cfg["lr"] / 2)
    with pytest.raises(CheckpointError, match=refusal):
        run(cfg, 2)
    assert metrics.read_text() == before
    client.node._local.clear()


def snapshot_run(tmp_path):
    """resume.resumable over a rule that stores one ArrayRecord; snapshots for rounds 1 and 2."""
    def rule(client_, content, state):
        state["c"] = ArrayRecord({"c": Array(np.ones(3, np.float32))})
        return RecordDict()

    run_rule = resume.resumable(rule, tmp_path)
    for server_round in (1, 2):
        run_rule(None, RecordDict({"config": ConfigRecord({"server-round": server_round, resume.LINEAGE: "ab"})}),
                 RecordDict())
    return run_rule


def test_a_damaged_node_snapshot_is_refused_by_name(tmp_path):
    run_rule = snapshot_run(tmp_path)
    newest = tmp_path / "ab-round-00000002.npz"
    newest.write_bytes(newest.read_bytes()[:100])
    state = RecordDict()
    with pytest.raises(CheckpointError, match=f"{newest}.*corrupted.*delete {newest.name}"):
        run_rule(None, RecordDict({"config": ConfigRecord({"server-round": 3, resume.LINEAGE: "ab"})}), state)
    assert "c" not in state  # never a fresh state the server's checkpoint does not match


def test_a_snapshot_holding_a_non_record_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "ab-round-00000009.npz", {"round": 9, "records": {"c": 5}})
    with pytest.raises(CheckpointError, match=f"{path}.*not all ArrayRecords"):
        resume.restore(tmp_path, "ab", 10, RecordDict())


@pytest.mark.parametrize("reference,text", [
    (ArrayRecord({"w": Array(np.zeros((3, 2), np.float32))}), "another model"),  # another architecture
    (ArrayRecord({"v": Array(np.zeros((2, 3), np.float32))}), "another model"),
])
def test_a_checkpoint_of_another_model_is_refused(saved, reference, text):
    cfg, _ = saved
    strategy, mirror, writer = parts(cfg)
    with pytest.raises(CheckpointError, match=text):
        Checkpointer(cfg, lambda *_: None).resume(strategy, mirror, writer, reference)
    assert Checkpointer(cfg, lambda *_: None).resume(*parts(cfg), model(0.0))[1] == 2  # the same model resumes


def test_ledgers_of_partitions_the_run_lacks_are_refused(saved):
    cfg, path = saved
    def mirror(change):
        return lambda lines: [{**line, "mirror": change(line["mirror"])} for line in lines]

    rewrite_journal(path, mirror(lambda ledgers: {**ledgers, "7": []}))
    with pytest.raises(CheckpointError, match=r"partitions \[7\]"):
        Checkpointer(cfg, lambda *_: None).resume(*parts(cfg))
    rewrite_journal(path, mirror(lambda ledgers: {"x": []}))
    with pytest.raises(CheckpointError, match="partition ids"):
        Checkpointer(cfg, lambda *_: None).resume(*parts(cfg))
