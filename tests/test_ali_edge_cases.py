"""ALI-DPFL edge cases, one regression test each (the strategy driven directly, no clients)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common import Metadata
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from client.privacy import BUDGET_EXHAUSTED
from common.config import ConfigError, validate
from common.privacy.accounting import ali_epsilon
from common.privacy.ali import GRAD_DIFF_METRIC
from common.records import ARRAYS, METRICS, NUM_EXAMPLES
from server.roster import Roster
from server.strategies.ali_dpfl import AliDpfl

pytestmark = pytest.mark.timeout(120)

Q, SIGMA, DELTA = 0.2, 1.0, 1e-5
ROSTER = Roster(node_of={0: 101, 1: 102, 2: 103}, num_examples={0: 100, 1: 100, 2: 100})


def strategy(steps_budget, rounds, **extra):
    target = ali_epsilon(steps_budget, Q, SIGMA, DELTA) * 1.001  # R_c = steps_budget
    config = validate({"strategy": "ali-dpfl", "num-clients": 3, "num-rounds": rounds, "privacy": "dpsgd",
                       "dp-sample-rate": Q, "dp-noise-multiplier": SIGMA, "dp-clip": 1.0,
                       "lr": 0.1, "target-epsilon": target, "target-delta": DELTA, "accountant": "ali-eq12",
                       **extra})
    s = AliDpfl(ROSTER, 0, 1.0, log=lambda _: None, config=config)
    assert s.rc == steps_budget
    return s


@pytest.fixture(autouse=True)
def _server_identity():  # Flower stamps instructions with the running task's identity
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 7


def model(value=0.0):
    return ArrayRecord({"w": Array(np.full(6, value, np.float32))})


def reply(node, value, **metrics):
    meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="x",
                    group_id="", created_at=0.0, ttl=60.0, message_type="train")
    content = RecordDict({ARRAYS: model(value), METRICS: MetricRecord({NUM_EXAMPLES: 100, **metrics})})
    return Message(content=content, metadata=meta)


def refusal(node):
    meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="x",
                    group_id="", created_at=0.0, ttl=60.0, message_type="train")
    return Message(error=Error(code=BUDGET_EXHAUSTED, reason="refused"), metadata=meta)


def train_round(s, k, replies_of):
    messages = s.configure_train(k, model(float(k)), ConfigRecord({}), None)
    replies = replies_of(messages)
    for r in replies:  # what the runner does with a refusal before aggregation
        if r.has_error():
            s.retire(s._partition_of[r.metadata.src_node_id])
    s.aggregate_train(k, replies)
    return messages, s.extra_round_metrics()


def test_condition_one_reports_the_tau_it_runs():
    # R_s >= R_c: Lemma 1, tau* = 1 for every round; tau* used to stay at ali-tau-init in the metrics and T
    s = strategy(4, 6, **{"ali-tau-init": 3})
    _, row = train_round(s, 1, lambda ms: [reply(101, 1.0), reply(102, 1.0), reply(103, 1.0)])
    assert row["ali_tau"] == 1 and row["ali_tau_next"] == 1
    assert row["ali_T"] == 4  # min(R_s * 1, R_c)


def test_all_refusing_is_not_reported_as_the_budget_reached():
    # every client refuses (its own ledger is ahead, e.g. a replayed round after a resume): the server's
    # counter must not jump to R_c in the metrics, nor the log claim R_c was reached
    logs = []
    s = strategy(13, 5)
    s.log = logs.append
    train_round(s, 1, lambda ms: [reply(101, 1.0), reply(102, 1.0), reply(103, 1.0)])
    _, row = train_round(s, 2, lambda ms: [refusal(101), refusal(102), refusal(103)])
    assert row["ali_steps"] == 3  # round 1's 3 steps; round 2 ran none
    assert not any("reached" in line for line in logs)


def test_one_client_without_a_grad_diff_does_not_blind_the_paper_estimator():
    # the reply screen keeps only metrics every reply has: one client leaving out (or garbling) its
    # report used to drop every client's report, so mu was never estimated
    s = strategy(13, 4, **{"ali-mu-estimator": "paper"})
    s.log = lambda _: None

    def replies(ms):
        return [reply(101, 2.0, **{GRAD_DIFF_METRIC: 2.0}), reply(102, 2.0, **{GRAD_DIFF_METRIC: 2.0}),
                reply(103, 2.0, **{GRAD_DIFF_METRIC: [1.0, 2.0]})]
    _, row = train_round(s, 1, replies)
    # w = 1 -> w^i = 2 (6 coordinates): ||w^i - w|| = sqrt(6); the two reports average to 2 / sqrt(6)
    assert row["ali_mu_raw"] == pytest.approx(2.0 / np.sqrt(6))


def test_ali_refuses_the_upcycled_wrapper():
    # Upcycled-FL's even rounds train nobody: R_s (num-rounds) would count them, so condition I/II, the
    # budget spreading and T were planned on rounds that never train (and the wrapper hid the ALI metrics)
    with pytest.raises(ConfigError, match="upcycled"):
        strategy(13, 10, upcycled=True)
