"""The checkpoint's journal (server/checkpoint.py, format version 3): results rows and privacy-mirror
entries are appended once, so a save costs O(this round); a resume reads exactly the bytes the
checkpoint covers, checks their digest chain, and refuses a journal that is missing or damaged."""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

import server.checkpoint
from common.privacy.events import dpsgd_steps
from server.checkpoint import CheckpointError, Checkpointer, load_checkpoint, save_checkpoint
from server.privacy_mirror import PrivacyMirror
from server.results import ResultsWriter
from server.strategies.registry import build_strategy
from fault_grids import Killed
from test_checkpoint import STEPS, client_steps, mirror_steps, resumable, run
from test_checkpoint_damage import ROSTER

MODEL = ArrayRecord({"w": Array(np.full((2, 3), 0.5, np.float32))})


def parts(cfg):
    strategy = build_strategy(cfg, ROSTER, lambda *_: None)
    return strategy, PrivacyMirror(cfg, ROSTER.partitions), ResultsWriter(cfg["results-dir"], "r")


def play(checkpointer, strategy, mirror, writer, rounds, first=1):
    """Rounds as the runner records them: one DP-SGD entry per client, one row, then the save."""
    for r in range(first, first + rounds):
        for p in ROSTER.partitions:
            mirror.record(p, [dpsgd_steps(0.2, 1.0, STEPS, round=r)])
        writer.add_round({"round": r, "accuracy": 0.5, "loss": 1.0 / r, **mirror.round_metrics()})
        checkpointer.save(r, MODEL, strategy, mirror, writer)


def journal_rounds(checkpointer):
    return [json.loads(line)["round"] for line in checkpointer.journal_path.read_text().splitlines()]


def test_the_checkpoint_does_not_grow_with_the_round(tmp_path):
    cfg = resumable(tmp_path)
    checkpointer, (strategy, mirror, writer) = Checkpointer(cfg, lambda *_: None), parts(cfg)
    play(checkpointer, strategy, mirror, writer, 3)
    size_3, journal_3 = checkpointer.path.stat().st_size, checkpointer.journal_path.stat().st_size
    play(checkpointer, strategy, mirror, writer, 27, first=4)
    assert abs(checkpointer.path.stat().st_size - size_3) <= 16  # the journal's length grows by a digit or two
    assert checkpointer.journal_path.stat().st_size == pytest.approx(10 * journal_3, rel=0.05)  # one line a round
    assert journal_rounds(checkpointer) == list(range(1, 31))

    again = parts(cfg)
    assert Checkpointer(cfg, lambda *_: None).resume(*again, MODEL)[1] == 31
    assert again[2].rows == writer.rows and again[1].epsilons() == mirror.epsilons()


def test_a_tail_past_the_checkpoint_is_ignored_and_cut_off(tmp_path):
    """A line appended for a round whose checkpoint never landed is not read, and the next save replaces it."""
    cfg = resumable(tmp_path)
    checkpointer, (strategy, mirror, writer) = Checkpointer(cfg, lambda *_: None), parts(cfg)
    play(checkpointer, strategy, mirror, writer, 2)
    with checkpointer.journal_path.open("ab") as fh:
        fh.write(b'{"round": 3, "rows": [{"round": 3}], "mirror": {"0": [{"torn')
    resumed = Checkpointer(cfg, lambda *_: None)
    again = parts(cfg)
    assert resumed.resume(*again, MODEL)[1] == 3
    assert again[2].rows == writer.rows and again[1].epsilons() == mirror.epsilons()
    play(resumed, *again, 1, first=3)
    assert journal_rounds(resumed) == [1, 2, 3]


def test_a_journal_cut_during_the_run_is_never_padded(tmp_path):
    """The next save must not write past a hole (truncate extends a shorter file with zeros)."""
    cfg = resumable(tmp_path)
    checkpointer, (strategy, mirror, writer) = Checkpointer(cfg, lambda *_: None), parts(cfg)
    play(checkpointer, strategy, mirror, writer, 2)
    size = checkpointer.journal_path.stat().st_size
    checkpointer.journal_path.write_bytes(checkpointer.journal_path.read_bytes()[:10])
    with pytest.raises(CheckpointError, match=f"{checkpointer.journal_path}.*fewer than the {size}"):
        play(checkpointer, strategy, mirror, writer, 1, first=3)
    assert load_checkpoint(checkpointer.path)["round"] == 2


def dies_saving(server_round):
    """`save_checkpoint` of server.checkpoint that dies writing the checkpoint of `server_round`: after
    that round's journal line was appended, before the npz landed."""
    real = server.checkpoint.save_checkpoint

    def save(path, state):
        if path.name.endswith(".ckpt.npz") and state.get("round") == server_round:
            raise Killed("ServerApp killed between the journal append and the checkpoint")
        return real(path, state)
    return save


def test_a_crash_between_journal_append_and_checkpoint_counts_the_lost_round_once(tmp_path, monkeypatch):
    cfg = resumable(tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(server.checkpoint, "save_checkpoint", dies_saving(2))
        with pytest.raises(Killed):
            run(cfg, 1)
    checkpointer = Checkpointer(cfg)
    assert load_checkpoint(checkpointer.path)["round"] == 1 and journal_rounds(checkpointer) == [1, 2]
    resumed = run(cfg, 2)
    rows = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    # rounds 1 and 3, and round 2 twice (the clients charged it before the crash and again on its re-run):
    # the in-flight record counts the lost one, the journal's orphaned line does not count it again
    assert mirror_steps(resumed) == {p: 4 * STEPS for p in range(3)}
    assert all(client_steps(cfg, p) == 4 * STEPS for p in range(3))
    assert journal_rounds(checkpointer) == [1, 1, 2, 3]  # the orphaned line cut off; round 1's charge re-saved


def cut(path):
    path.write_bytes(path.read_bytes()[:-40])


def edit(path):  # same length, one row's accuracy changed: only the digest can tell
    text = path.read_text()
    i = text.index('"accuracy":') + len('"accuracy":')
    path.write_text(text[:i] + ("1" if text[i] != "1" else "2") + text[i + 1:])


DAMAGE = {"cut": cut, "edited": edit, "missing": lambda path: path.unlink(),
          "replaced by another": lambda path: path.write_text('{"round":1,"rows":[],"mirror":{}}\n' * 2)}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_journal_is_refused_by_name_and_the_results_stay(tmp_path, damage):
    cfg = resumable(tmp_path, **{"num-rounds": 2})
    metrics = run(cfg, 1) / "metrics.jsonl"
    before = metrics.read_text()
    journal = Checkpointer(cfg).journal_path
    DAMAGE[damage](journal)
    with pytest.raises(CheckpointError, match="another run-name") as refused:
        run(cfg, 2)
    assert str(journal) in str(refused.value)
    assert metrics.read_text() == before


def as_version_2(checkpointer, mirror, writer):
    """Rewrite the checkpoint in the version-2 layout (rows and mirror inline, no journal)."""
    ckpt = load_checkpoint(checkpointer.path)
    del ckpt["journal"]
    save_checkpoint(checkpointer.path, {**ckpt, "version": 2, "rows": list(writer.rows),
                                        "mirror": {str(p): led.to_json() for p, led in mirror.ledgers.items()}})
    checkpointer.journal_path.unlink()


def test_a_version_2_checkpoint_resumes_and_starts_the_journal(tmp_path):
    cfg = resumable(tmp_path, **{"num-rounds": 6})
    checkpointer, (strategy, mirror, writer) = Checkpointer(cfg, lambda *_: None), parts(cfg)
    play(checkpointer, strategy, mirror, writer, 3)
    as_version_2(checkpointer, mirror, writer)

    resumed, again = Checkpointer(cfg, lambda *_: None), parts(cfg)
    assert resumed.resume(*again, MODEL)[1] == 4
    assert again[2].rows == writer.rows and again[1].epsilons() == mirror.epsilons()
    play(resumed, *again, 1, first=4)  # the first save: version 3, every row and entry in one line
    assert load_checkpoint(resumed.path)["version"] == 3 and journal_rounds(resumed) == [4]

    third = parts(cfg)
    assert Checkpointer(cfg, lambda *_: None).resume(*third, MODEL)[1] == 5
    assert [r["round"] for r in third[2].rows] == [1, 2, 3, 4]
    assert third[2].rows == again[2].rows and third[1].epsilons() == again[1].epsilons()
    assert all(len(third[1].ledgers[p]) == 4 for p in ROSTER.partitions)


def test_a_failed_journal_append_keeps_the_mirror_entries_for_the_next_save(tmp_path, monkeypatch):
    """A save whose journal append fails must not drop the round's mirror entries: a later save in the
    same process journals them, and a resume from it counts every round."""
    cfg = resumable(tmp_path)
    checkpointer, (strategy, mirror, writer) = Checkpointer(cfg, lambda *_: None), parts(cfg)
    play(checkpointer, strategy, mirror, writer, 1)
    real = server.checkpoint.append_journal

    def full(*args):
        raise OSError(28, "No space left on device", str(checkpointer.journal_path))

    monkeypatch.setattr(server.checkpoint, "append_journal", full)
    with pytest.raises(OSError):
        play(checkpointer, strategy, mirror, writer, 1, first=2)
    monkeypatch.setattr(server.checkpoint, "append_journal", real)
    play(checkpointer, strategy, mirror, writer, 1, first=3)
    again = parts(cfg)
    Checkpointer(cfg, lambda *_: None).resume(*again, MODEL)
    assert again[1].epsilons() == mirror.epsilons()  # rounds 1-3 in both
