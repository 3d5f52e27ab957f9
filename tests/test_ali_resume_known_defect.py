"""ALI-DPFL resumed after a crash between recording a round as in flight and sending it: a known defect,
kept as a strict xfail until the server can learn the clients' real step counts (review of session 16)."""

import pytest

from client.privacy import ledger_path
from common.privacy.ledger import PrivacyLedger
from tests.test_ali_budget_state import CLIENTS, DELTA, ali_config, rows_of, run

pytestmark = pytest.mark.timeout(180)


@pytest.mark.xfail(strict=True, reason="known: the mirror's upper bound for a lost round raises t to R_c although "
                   "no client ran it; the budget is under-spent (the safe side). Fix: ask the nodes for their steps")
def test_resume_after_a_crash_before_the_instructions_left_still_spends_the_budget(tmp_path):
    """R_s = 4 < R_c = 13. The server dies after recording round 3 as in flight (Checkpointer.begin_round) but before
    its instructions leave: no client ran or charged round 3 (their ledgers hold 7 steps). On resume the
    mirror counts the lost round as an upper bound and `AliDpfl.sync_with_mirror` raises t to it (13 = R_c),
    so the resumed round 3 is planned with tau = 0, every client is retired and the run ends after a round
    in which nothing trained: each ledger ends at 7 of 13 steps, epsilon 5.88 of the target 7.56 (78 %),
    although rounds 3 and 4 were still available. A run with R_s < R_c must end within 1 % of its target,
    and the server's t must match what the clients actually spent."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=4, checkpoint=True, **{"dp-noise-seed": "run-seed"})
    run(cfg, run_id=1, die_after=2, after_replies=False)  # killed while sending round 3: nothing left
    results = run(cfg, run_id=2)
    rows = rows_of(results)
    target = float(cfg["target-epsilon"])
    ledgers = [PrivacyLedger.load(ledger_path(cfg, {}, 2, p)) for p in range(CLIENTS)]
    assert all(r["ali_tau"] >= 1 for r in rows), [(r["round"], r["ali_tau"]) for r in rows]  # no empty round
    assert [rows[-1]["ali_steps"]] * CLIENTS == [lg.steps() for lg in ledgers]
    for lg in ledgers:
        eps = lg.epsilon(DELTA, accountant="ali-eq12")
        assert 0.99 * target <= eps <= target, (lg.steps(), eps, target)
