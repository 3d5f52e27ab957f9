"""Rounds the clients never ran must not count in ALI-DPFL's t: a round a crashed server lost (which clients
charged it: server/lost_round.py, and the fence that keeps the nodes' reports true: client/privacy.py
`report_and_fence`), and a round secure aggregation never sent."""

import json

import pytest

import client.node
from client.privacy import EarlierStart, StaleInstruction, charge, ledger_path, report_and_fence
from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger
from server.delegating_grid import DelegatingGrid
from server.inprocess_grid import InProcessGrid
from server.lost_round import LedgerTail, not_charged, parse_tail
from server.runner import run_federation
from tests.test_ali_budget_state import CLIENTS, DELTA, ali_config, rows_of, run

LINEAGE = "ab12"
BUDGET = {"target-epsilon": 100.0, "target-delta": 1e-5, "accountant": "rdp"}


def steps(n, round_):
    return dpsgd_steps(0.01, 1.1, n, round=round_)


def assert_budget_spent(cfg, results, run_id=0):
    """t after the run equals every client's ledger, every round trained, and each ledger ends within 1 % of
    the target (R_s < R_c), never past it."""
    rows, target = rows_of(results), float(cfg["target-epsilon"])
    ledgers = [PrivacyLedger.load(ledger_path(cfg, {}, run_id, p)) for p in range(CLIENTS)]
    assert all(r["ali_tau"] >= 1 for r in rows), [(r["round"], r["ali_tau"]) for r in rows]  # no empty round
    assert [rows[-1]["ali_steps"]] * CLIENTS == [lg.steps() for lg in ledgers]
    for lg in ledgers:
        eps = lg.epsilon(DELTA, accountant="ali-eq12")
        assert 0.99 * target <= eps <= target, (lg.steps(), eps, target)


@pytest.mark.timeout(180)
def test_resume_after_a_crash_before_the_instructions_left_still_spends_the_budget(tmp_path):
    """R_s = 4 < R_c = 13. The server dies after recording round 3 as in flight but before its instructions
    leave: no client charged it. Before the nodes reported their ledgers, the mirror counted the lost round
    (its upper bound), t followed it to 13 = R_c and the run ended with every ledger at 7 of 13 steps,
    epsilon 5.88 of the target 7.56 (the defect of session 16)."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=4, checkpoint=True, **{"dp-noise-seed": "run-seed"})
    run(cfg, run_id=1, die_after=2, after_replies=False)  # killed while sending round 3: nothing left
    assert_budget_spent(cfg, run(cfg, run_id=2))
    for p in range(CLIENTS):  # each node's fence: the resumed start's run id and its enrollment time
        run_id, started = ledger_path(cfg, {}, 0, p).with_suffix("").with_suffix(".server-run").read_text().split()
        assert run_id == "2" and int(started) > 0


@pytest.mark.timeout(240)
def test_a_second_crash_before_the_resent_round_left_is_not_counted_twice(tmp_path):
    """Crash 1 after the clients charged round 2 (the resume counts it: their reports show it), crash 2 while
    the resumed server sends round 2 again (nothing left: the reports show round 2's one charge, which the
    mirror holds already). The run then ends with t equal to the ledgers and the budget spent."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=4, checkpoint=True, **{"dp-noise-seed": "run-seed"})
    run(cfg, run_id=1, die_after=2, after_replies=True)
    run(cfg, run_id=2, die_after=0)
    assert_budget_spent(cfg, run(cfg, run_id=3))


class LateEnrollment(DelegatingGrid):
    """Loses the first `times` secure-aggregation enrollment replies of the first node."""

    def __init__(self, inner, times):
        super().__init__(inner)
        self.times = times

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        if messages and messages[0].metadata.message_type == "query.secagg_enroll" and self.times > 0:
            self.times -= 1
            late = min(self.get_node_ids())
            replies = [r for r in replies if r.metadata.src_node_id != late]
        return replies


@pytest.mark.timeout(180)
def test_a_secure_round_aborted_before_sending_costs_no_step(tmp_path):
    """One node's secure-aggregation enrollment is lost twice (at the start and again before round 1), so
    round 1 has 2 usable nodes of the 3 it needs and is aborted before any instruction leaves. ALI-DPFL had
    already added round 1's tau (4) to every client's t: the run then ended short of the budget (ledgers at
    9 of 13 steps) although no client ran round 1."""
    cfg = ali_config(tmp_path, steps_budget=13, rounds=4, **{"secure-aggregation": True,
                                                               "secagg-min-survivors": CLIENTS})
    client.node._local.clear()
    with InProcessGrid("client.app:app", dict(cfg), CLIENTS, run_id=1) as grid:
        results = run_federation(LateEnrollment(grid, times=2), cfg)
    rows = rows_of(results)
    assert rows[0]["secagg_round_trips"] == 0 and rows[1]["secagg_round_trips"] >= 1  # round 1 never left
    assert_budget_spent(cfg, results, run_id=1)


def test_a_report_proves_no_charge_only_for_this_lineage_and_the_same_entries():
    lost, earlier = [steps(3, 5)], [steps(2, 4)]
    tail = LedgerTail(LINEAGE, 4, tuple(earlier))
    assert not_charged(tail, LINEAGE, earlier, lost)  # the node's last round is the one before
    assert not not_charged(LedgerTail(LINEAGE, 5, tuple(lost)), LINEAGE, earlier, lost)  # it charged round 5
    assert not not_charged(LedgerTail("ffff", 4, tuple(earlier)), LINEAGE, earlier, lost)  # another start's
    assert not not_charged(None, LINEAGE, earlier, lost)  # no report (an older ClientApp): counted
    assert not not_charged(LedgerTail(LINEAGE, 6, (steps(1, 6),)), LINEAGE, earlier, lost)  # a round never sent
    # round 1 of a fresh start never left: the empty ledger the dead start's own enrollment fenced proves it
    assert not_charged(LedgerTail("", -1, (), fence_started=5), LINEAGE, [], [steps(3, 1)], started=5)
    # one no start, or another start, fenced was deleted or moved since: the one the round reached may have charged
    assert not not_charged(LedgerTail("", -1, ()), LINEAGE, [], [steps(3, 1)], started=5)
    assert not not_charged(LedgerTail("", -1, (), fence_started=6), LINEAGE, [], [steps(3, 1)], started=5)
    assert not not_charged(LedgerTail("", -1, (), fence_started=5), LINEAGE, [], [steps(3, 1)])  # an older record
    assert not not_charged(LedgerTail("", 1, (steps(3, 1),)), LINEAGE, [], [steps(3, 1)])  # unbound entries
    # round 5 charged once before (a first lost round, counted), its re-sending lost again: one charge held
    assert not_charged(LedgerTail(LINEAGE, 5, tuple(lost)), LINEAGE, [*earlier, *lost], lost)
    assert not not_charged(LedgerTail(LINEAGE, 5, (*lost, *lost)), LINEAGE, [*earlier, *lost], lost)
    # entries that differ from what the mirror holds (another tau) prove nothing
    assert not not_charged(LedgerTail(LINEAGE, 5, (steps(4, 5),)), LINEAGE, [*earlier, *lost], lost)


@pytest.mark.parametrize("info", [
    {}, {"ledger-lineage": 1, "ledger-last-round": 4, "ledger-last-entries": "[]"},
    {"ledger-lineage": "ab", "ledger-last-round": True, "ledger-last-entries": "[]"},
    {"ledger-lineage": "ab", "ledger-last-round": 4, "ledger-last-entries": "not json"},
    {"ledger-lineage": "ab", "ledger-last-round": 4, "ledger-last-entries": "[]"},  # round 4 without entries
    {"ledger-lineage": "ab", "ledger-last-round": 4, "ledger-last-entries": json.dumps([steps(1, 3).to_json()])},
    {"ledger-lineage": "ab", "ledger-last-round": -2, "ledger-last-entries": "[]"},
    {"ledger-lineage": "ab", "ledger-last-round": 4, "ledger-last-entries": json.dumps([{"kind": "dpsgd"}])},
])
def test_a_malformed_report_is_no_report(info):
    assert parse_tail(info) is None


def test_the_report_round_trips_and_fences_off_the_dead_server_start(tmp_path):
    """The enrollment report of a ledger, read back by the server; after it, an instruction of the dead
    server start (another Flower run) is refused without a charge, the new start's is charged."""
    missing = tmp_path / "partition-1.ledger.json"
    assert parse_tail(report_and_fence(missing, server_run=8)) == LedgerTail("", -1, ())
    assert not missing.exists()  # reported empty, not created
    assert parse_tail(report_and_fence(missing, server_run=9, started=11)) == LedgerTail("", -1, ())  # 8's: no time
    assert parse_tail(report_and_fence(missing, server_run=10, started=12)) == LedgerTail("", -1, (), fence_started=11)
    ledger = PrivacyLedger.open(tmp_path / "partition-0.ledger.json", owner="partition-0")
    charge(ledger, BUDGET, [steps(2, 1)], server_run=7)  # no fence yet: any run charges
    charge(ledger, BUDGET, [steps(3, 2)], server_run=7)
    tail = parse_tail(report_and_fence(ledger.path, server_run=8))
    assert tail == LedgerTail("", 2, (steps(3, 2),))
    with pytest.raises(StaleInstruction, match="run 8"):
        charge(ledger, BUDGET, [steps(3, 3)], server_run=7)
    assert PrivacyLedger.load(ledger.path).steps() == 5  # nothing charged
    charge(ledger, BUDGET, [steps(3, 3)], server_run=8)
    assert PrivacyLedger.load(ledger.path).steps() == 8


def test_a_late_enrollment_of_an_earlier_start_leaves_the_fence(tmp_path):
    """Flower run ids are random: the fence is ordered by the enrolling start's time. A dead start's
    enrollment delivered after the live start's would otherwise move the fence back, and the live start's
    instructions would be refused while the dead start's charged."""
    ledger = PrivacyLedger.open(tmp_path / "partition-0.ledger.json", owner="partition-0")
    report_and_fence(ledger.path, server_run=9, started=2_000)  # the live start
    with pytest.raises(EarlierStart, match="clock"):  # the dead one's, delivered late: refused, fence kept
        report_and_fence(ledger.path, server_run=8, started=1_000)
    with pytest.raises(StaleInstruction, match="run 9"):
        charge(ledger, BUDGET, [steps(3, 1)], server_run=8)
    charge(ledger, BUDGET, [steps(3, 1)], server_run=9)
    report_and_fence(ledger.path, server_run=10, started=3_000)  # a later start moves it
    with pytest.raises(StaleInstruction, match="run 10"):
        charge(ledger, BUDGET, [steps(3, 2)], server_run=9)
    assert PrivacyLedger.load(ledger.path).steps() == 3


def test_a_start_time_far_ahead_of_the_nodes_clock_is_refused_and_leaves_the_fence(tmp_path):
    """A server whose clock is wrong by years would set a fence no later start could pass (each would be
    refused as earlier) until someone deleted the file. An enrollment more than an hour ahead of the node's
    clock is refused, naming both clocks, and the fence stays with the last believable start."""
    import time

    ledger = PrivacyLedger.open(tmp_path / "partition-0.ledger.json", owner="partition-0")
    now = time.time_ns()
    report_and_fence(ledger.path, server_run=9, started=now)
    with pytest.raises(EarlierStart, match="ahead of this node's clock"):
        report_and_fence(ledger.path, server_run=10, started=now + 10 * 365 * 86400 * 10**9)
    charge(ledger, BUDGET, [steps(3, 1)], server_run=9)  # the fence still holds the start that enrolled before
    report_and_fence(ledger.path, server_run=11, started=now + 60 * 10**9)  # a minute of skew is fine
    assert PrivacyLedger.load(ledger.path).steps() == 3


@pytest.mark.parametrize("content", ["x y", "", "12 nan", "-"])
def test_a_damaged_fence_is_no_fence(tmp_path, content):
    """A fence file that does not parse neither blocks every charge nor crashes enrollment: the next enrollment
    rewrites it."""
    ledger = PrivacyLedger.open(tmp_path / "partition-0.ledger.json", owner="partition-0")
    (tmp_path / "partition-0.server-run").write_text(content)
    charge(ledger, BUDGET, [steps(3, 1)], server_run=5)
    report_and_fence(ledger.path, server_run=6, started=10)
    with pytest.raises(StaleInstruction):
        charge(ledger, BUDGET, [steps(3, 2)], server_run=5)


@pytest.mark.timeout(120)
def test_a_resumed_start_whose_clock_is_behind_is_refused_at_enrollment(tmp_path, monkeypatch):
    """The fence keeps the start with the latest `server-started`. A resumed ServerApp on a host whose clock is
    behind the dead start's used to enroll every node, whose fences still held the dead start: every train
    instruction was refused, ALI-DPFL counted the steps and the run ended as a result with every ledger at
    7 of 13 steps (review of session 18). It must fail at enrollment, naming the clock."""
    import time

    import server.roster
    from server.roster import FederationError

    cfg = ali_config(tmp_path, steps_budget=13, rounds=4, checkpoint=True, **{"dp-noise-seed": "run-seed"})
    run(cfg, run_id=1, die_after=2, after_replies=False)  # the first start dies sending round 3
    real = time.time_ns
    monkeypatch.setattr(server.roster.time, "time_ns", lambda: real() - 3600 * 10**9)  # the new host: 1 h behind
    with pytest.raises(FederationError, match="clock"):
        run(cfg, run_id=2)
    monkeypatch.setattr(server.roster.time, "time_ns", real)  # the clock fixed: the run resumes and ends exact
    assert_budget_spent(cfg, run(cfg, run_id=3))
