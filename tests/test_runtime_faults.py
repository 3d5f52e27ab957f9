"""Faults during a run, seen from the server: replies rewritten between the clients and the server
(in-process engine). The server never crashes on one bad reply, the global model and the privacy
ledgers are never corrupted, and metrics.jsonl / summary.json stay truthful. Each test is a defect an
adversarial review found (session 12).
"""

import io
import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from rich.console import Console

import client.node
from common.config import validate
from common.data import load_federation
from server.inprocess_grid import InProcessGrid, node_ids_for
from server.roster import Roster
from server.runner import run_federation

BASE = {"num-clients": 3, "seed": 3, "synthetic-dim": 10, "dataset": "synthetic"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Tamper:
    """Between the runner (or the secure-aggregation grid) and the in-process grid: the clients run and
    reply as usual, then `edit(messages, replies)` rewrites the replies of messages of `message_type`,
    as a hostile or broken client's would arrive at the server."""

    def __init__(self, inner, edit, message_type="train"):
        self.inner, self.edit, self.message_type = inner, edit, message_type

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        if messages and messages[0].metadata.message_type == self.message_type:
            replies = self.edit(messages, replies)
        return replies

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(tmp_path, edit=None, message_type="train", run_id=5, **overrides):
    """One in-process run on the generated federation; (results folder, rows, console output, grid)."""
    client.node._local.clear()
    config = validate({**BASE, "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state"),
                       "run-name": "r", **overrides})
    out = io.StringIO()
    with InProcessGrid("client.app:app", dict(config), int(config["num-clients"]), run_id=run_id) as grid:
        wrapped = grid if edit is None else Tamper(grid, edit, message_type)
        results = run_federation(wrapped, config, Console(file=out, width=400))
    rows = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines()]
    return results, rows, out.getvalue(), grid


def rewritten(reply: Message, content: RecordDict) -> Message:
    return Message(content=content, metadata=reply.metadata)


# --- 1. a run in which every reply was screened out ends as if it were a result ---------------------------
def _all_nan(messages, replies):
    out = []
    for r in replies:
        if r.has_error():
            out.append(r)
            continue
        content = RecordDict(dict(r.content.items()))
        content["arrays"] = ArrayRecord({k: Array(np.full_like(a.numpy(), np.nan))
                                         for k, a in content["arrays"].items()})
        out.append(rewritten(r, content))
    return out


def test_a_run_in_which_no_reply_was_ever_usable_is_not_reported_as_a_result(tmp_path):
    """Every client replies with a NaN model in every round (a diverged client rule, a broken build):
    every reply is screened out, the model never moves. When every client *errors* instead, the runner
    raises "no round updated the model; clients failed: ..." so that the run "must not look like a
    result" (server/runner.py). With screened-out replies it ends normally: exit status 0, summary.json
    with final accuracy = initial accuracy, "privfed: final accuracy ..." and a results folder.
    Measured: 2 rounds, 6 of 6 replies dropped for NaN, summary.json written, no error."""
    with pytest.raises(RuntimeError, match="NaN or inf"):
        run(tmp_path, _all_nan, **{"num-rounds": 2})
    assert not (tmp_path / "results" / "r" / "summary.json").exists()


def _all_refuse(messages, replies):
    from flwr.app import Error

    from client.privacy import BUDGET_EXHAUSTED

    return [Message(Error(code=BUDGET_EXHAUSTED, reason="refused: budget spent"), reply_to=m) for m in messages]


def test_a_run_whose_clients_all_refuse_their_first_instruction_is_not_reported_as_a_result(tmp_path):
    """Every client refuses round 1 for its privacy budget (its ledger is already spent, e.g. a re-run
    on the same state-dir). The runner means to stop with "no round ran: every client refused its first
    instruction (privacy budget)" (server/runner.py), but the row of the refused round 1 is written
    before that check, so it can never fire: the run ends normally with summary.json, final accuracy =
    initial accuracy (0.5227), and "privfed: final accuracy ...". Measured: no error, 1 row, summary.json."""
    with pytest.raises(RuntimeError, match="refused"):
        run(tmp_path, _all_refuse, **{"num-rounds": 3})
    assert not (tmp_path / "results" / "r" / "summary.json").exists()


# --- 2. secure aggregation trusts a weight scale the roster already knows to be false ----------------------
def _claim_examples(claimed):
    def edit(messages, replies):
        liar = messages[0].metadata.dst_node_id
        out = []
        for r in replies:
            if r.metadata.src_node_id == liar and not r.has_error():
                fields = dict(r.content["secagg"])
                fields["num-examples"] = claimed
                r = rewritten(r, RecordDict({"secagg": ConfigRecord(fields)}))
            out.append(r)
        return out
    return edit


def test_one_inflated_secure_aggregation_enrollment_does_not_stall_every_round(tmp_path):
    """Under secure aggregation the weight scale is the largest num-examples of the `secagg_enroll`
    replies, which are checked only for being a non-negative int (server/secagg_grid.py, `enroll`). The
    roster has already enrolled every node with a size capped at its partition's true size, but the
    secure grid does not use it. One node claiming 2**40 examples there makes every honest weight
    w_i = n_i / 2**40 vanish below the fixed-point step: measured, every round logs "total weight 0.0 is
    not positive; the model stays unchanged", and a 2-round fedavg run ends at its initial loss (1.5591,
    accuracy 0.5227) instead of 0.3323 / 0.8693 — while every client's privacy is charged each round."""
    results, rows, log, _ = run(tmp_path, _claim_examples(2**40), message_type="query.secagg_enroll",
                                **{"num-rounds": 2, "secure-aggregation": True})
    initial = json.loads((results / "summary.json").read_text())["initial"]["loss"]
    assert "not positive" not in log
    assert all(row["loss"] < initial - 0.1 for row in rows), ([row["loss"] for row in rows], initial)


# --- 3. pFedMe: one client's claimed test size takes over the personal accuracy ----------------------------
def test_pfedme_personal_accuracy_is_not_taken_over_by_one_claimed_test_size(tmp_path):
    """pFedMe weights each client's personal accuracy by its self-reported `test-examples`; the check
    (server/strategies/pfedme.py) only bounds it below 2**31. The server knows every client's true test
    split (it loads the federation for the roster's sizes). One client reporting accuracy 0 on 2**31 - 1
    test examples drives the round's personal-accuracy to 1.5e-7, although the two honest clients, which
    hold 347 of the 352 test examples, report ~0.9 (floor 0.895). With the liar weighted by at most its true test
    size (5), the value cannot fall below sum_honest(a_i n_i) / (n_honest + 5)."""
    honest = {}
    nodes = node_ids_for(5, 3)  # the in-process grid's node of each partition (run_id 5, as `run`'s)
    liar = nodes[1]

    def edit(messages, replies):
        out = []
        for r in replies:
            metrics = dict(r.content["metrics"])
            if r.metadata.src_node_id == liar:
                metrics.update({"personal-accuracy": 0.0, "test-examples": 2**31 - 1})
                content = RecordDict(dict(r.content.items()))
                content["metrics"] = MetricRecord(metrics)
                r = rewritten(r, content)
            else:
                honest[r.metadata.src_node_id] = metrics["personal-accuracy"]
            out.append(r)
        return out

    _, rows, _, _ = run(tmp_path, edit, strategy="pfedme", **{"num-rounds": 1})
    config = validate({**BASE})
    tests = {nodes[p]: len(c.y_test) for p, c in enumerate(load_federation(config).clients)}
    assert len(honest) == 2 and tests[liar] == 5
    floor = sum(a * tests[n] for n, a in honest.items()) / (sum(tests[n] for n in honest) + tests[liar])
    assert rows[0]["train_personal_accuracy"] >= floor - 1e-9, (rows[0]["train_personal_accuracy"], floor)


# --- 4. pFedMe: one reply without a personal accuracy blanks the honest ones -------------------------------
ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 10, 1: 30, 2: 60})


def test_pfedme_keeps_the_honest_personal_accuracies_when_one_reply_lacks_its_own():
    """The reply screen drops, from EVERY reply, a metric that one reply lacks (harmonise_metrics), and
    pFedMe reads the personal accuracies after the screen. So one reply without `personal-accuracy`
    erases the two honest reports of 0.9: the round's metrics hold no personal-accuracy at all (in
    round 1; later rounds silently keep stale values). ALI-DPFL reads its per-client metric before
    screening for exactly this reason (server/strategies/ali_dpfl.py)."""
    from server.strategies.pfedme import PFedMe

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    strategy = PFedMe(ROSTER, seed=1, fraction_train=1.0, log=lambda _: None, test_sizes={0: 5, 1: 5, 2: 5})
    model = ArrayRecord({"w": Array(np.zeros((2, 3), np.float32))})
    replies = []
    for msg in strategy.configure_train(1, model, ConfigRecord(), None):
        metrics = {"num-examples": 10, "personal-accuracy": 0.9, "test-examples": 5}
        if msg.metadata.dst_node_id == 101:
            del metrics["personal-accuracy"]
        replies.append(Message(RecordDict({"arrays": model, "metrics": MetricRecord(metrics)}), reply_to=msg))
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics.get("personal-accuracy") == pytest.approx(0.9), dict(metrics)
    assert metrics.get("personal-clients") == 2, dict(metrics)


# --- 5. bytes_up is the client's claim, not the bytes that came --------------------------------------------
def _claim_shape(messages, replies):
    """Node 0's arrays keep their (valid .npy) bytes but declare shape (-10**6,): the wire format's
    Array.shape is a repeated int32 the client sets, separate from the payload numpy reads."""
    liar = messages[0].metadata.dst_node_id
    out = []
    for r in replies:
        if r.metadata.src_node_id == liar:
            content = RecordDict(dict(r.content.items()))
            content["arrays"] = ArrayRecord({k: Array(dtype=a.dtype, shape=(-10**6,), stype=a.stype, data=a.data)
                                             for k, a in content["arrays"].items()})
            r = rewritten(r, content)
        out.append(r)
    return out


def test_bytes_up_counts_what_arrived_not_the_shape_a_reply_declares(tmp_path):
    """MeteredGrid counts a reply's array bytes from its declared shape and dtype (common/records.py,
    arrays_nbytes), never from the payload. The reply above is screened as fine (numpy reads the real
    array from the bytes) and aggregates exactly as the honest one, yet the round's bytes_up in
    metrics.jsonl is -7,999,072 instead of 1,368 (a declared shape of (10**9, 10**9) gives 4e18)."""
    _, honest, _, _ = run(tmp_path / "honest", **{"num-rounds": 1})
    _, lied, _, _ = run(tmp_path / "lied", _claim_shape, **{"num-rounds": 1})
    assert lied[0]["accuracy"] == honest[0]["accuracy"]  # the same update was aggregated
    # what arrived: the liar's arrays count with their .npy headers (at most 128 bytes each, 2 arrays)
    assert honest[0]["bytes_up"] <= lied[0]["bytes_up"] <= honest[0]["bytes_up"] + 2 * 128, \
        (lied[0]["bytes_up"], honest[0]["bytes_up"])


def test_failed_and_missing_train_replies_are_counted_per_round_and_in_the_summary(tmp_path):
    """A run some of whose replies failed still updates the model, but it is not quite the planned experiment:
    each row counts the failed or missing train replies, summary.json totals them, and a suite report says so."""
    from flwr.app import Error

    from server.report import Cell, Suite, collect

    def edit(messages, replies):
        round_ = int(messages[0].content["config"]["server-round"])
        if round_ == 2:  # one error, one reply lost to the timeout
            first = Message(Error(code=0, reason="boom"), reply_to=messages[0])
            return [first, *replies[1:2]]
        return replies

    results, rows, _, _ = run(tmp_path, edit, **{"num-rounds": 3})
    assert [row["failed"] for row in rows] == [0, 2, 0]
    summary = json.loads((results / "summary.json").read_text())
    assert summary["failed_replies"] == 2
    suite_dir = tmp_path / "suite"
    cell = Cell(row="FedAvg", column="Syn", overrides={**BASE, "num-rounds": 3, "state-dir": str(tmp_path / "state")},
                seeds=(3,))
    (suite_dir / cell.folder).mkdir(parents=True)
    results.rename(suite_dir / cell.folder / "s3")
    suite = Suite(name="x", description="", seeds=(3,), cells=(cell,), rows=("FedAvg",), columns=("Syn",))
    [result] = collect(suite, suite_dir)
    assert any("2 train replies failed" in note for note in result.notes)
