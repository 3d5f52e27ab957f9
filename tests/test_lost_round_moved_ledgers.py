"""A lost round on a resume whose nodes opened other ledgers (a moved state-dir), and hostile reports (review of
session 17)."""

import pytest

from client.privacy import ledger_path
from common.checkpoint_file import CheckpointError
from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger
from server.lost_round import LedgerTail, not_charged, parse_tail
from tests.test_ali_budget_state import CLIENTS, ali_config, rows_of, run

LINEAGE = "ab12"


def steps(n, round_):
    return dpsgd_steps(0.01, 1.1, n, round=round_)


def test_an_empty_unbound_ledger_proves_nothing_when_the_mirror_holds_earlier_rounds():
    """The checkpoint's mirror says partition p charged rounds 1 and 2 (its instructions carried the run's
    lineage, so a ledger that charged them is bound to it). A report of an unbound, empty ledger ("" / -1)
    therefore comes from a ledger that is not the one that charged p's rounds (a moved or wiped state-dir,
    another machine now serving p): it cannot prove that p's real ledger did not charge lost round 3."""
    known = [steps(2, 1), steps(3, 2)]
    assert not not_charged(LedgerTail("", -1, ()), LINEAGE, known, [steps(3, 3)])


@pytest.mark.timeout(180)
def test_a_resume_that_opens_empty_ledgers_still_counts_the_round_the_old_ledgers_charged(tmp_path, monkeypatch,
                                                                                          capsys):
    """state-dir unset: the ledgers live in <results-dir>/node-state, and results-dir may change on a resume
    (server/checkpoint.py MAY_CHANGE) while checkpoint-dir stays. Start 1 dies after every client charged
    round 2 (in <A>/node-state). The resume, with results-dir B, enrolls nodes whose ledgers (in
    <B>/node-state) are empty and unbound; their reports used to be taken as proof that round 2 was not
    charged, so the mirror and ALI-DPFL's t dropped it: t = R_c = 13 at the end while the partitions' data
    took 13 + tau_2 DP-SGD steps (16 each, measured), the server reporting epsilon within
    the target. Either the resume is refused or the mirror keeps counting round 2."""
    monkeypatch.delenv("PRIVFED_STATE_DIR", raising=False)
    base = {"dp-noise-seed": "run-seed", "state-dir": "", "checkpoint-dir": str(tmp_path / "ckpt")}
    first = ali_config(tmp_path, steps_budget=13, rounds=4, checkpoint=True,
                       **{**base, "results-dir": str(tmp_path / "A")})
    run(first, run_id=1, die_after=2, after_replies=True)
    old = [PrivacyLedger.load(ledger_path(first, {}, 1, p)) for p in range(CLIENTS)]
    assert all(lg.rounds() == [1, 2] for lg in old)  # round 2 charged, not checkpointed
    second = ali_config(tmp_path, steps_budget=13, rounds=4, checkpoint=True,
                        **{**base, "results-dir": str(tmp_path / "B")})
    try:
        results = run(second, run_id=2)
    except CheckpointError:
        return  # refusing to resume onto other ledgers is a fix too
    assert "report empty privacy ledgers, but the checkpoint counts charges" in capsys.readouterr().out
    new = [PrivacyLedger.load(ledger_path(second, {}, 2, p)) for p in range(CLIENTS)]
    spent = [a.steps() + b.steps() for a, b in zip(old, new)]  # what each partition's data took
    t = rows_of(results)[-1]["ali_steps"]
    assert all(t >= s for s in spent), (t, spent)  # the server's count is an upper bound of the real one
    assert all(s <= 13 for s in spent), spent  # R_c: the target


def test_a_deeply_nested_report_is_no_report():
    """A malformed enrollment report must read as no report (the lost round is counted), not crash the
    server's enrollment: json.loads raises RecursionError on deep nesting, which parse_tail does not catch."""
    assert parse_tail({"ledger-lineage": "ab", "ledger-last-round": 4,
                       "ledger-last-entries": "[" * 100_000}) is None
