"""The server's mirror records an instruction's entries when the update may have been released:
a reply without error, or no reply; never an error reply, nor a node the instruction never reached."""

from types import SimpleNamespace as NS

import pytest

from client.privacy import BUDGET_EXHAUSTED
from common.config import validate
from common.privacy.ledger import PrivacyLedger
from common.privacy.plan import planned_entries
from server.privacy_mirror import PrivacyMirror
from server.runner import account_round, instructed, planned_by_partition

CONFIG = validate({"num-clients": 5, "privacy": "dpsgd", "local-steps": 10, "dp-sample-rate": 0.1,
                   "dp-noise-multiplier": 1.0, "target-epsilon": 0.0})
NODES = {p: 100 + p for p in range(5)}


def _reply(node, code=None):
    error = None if code is None else NS(code=code, reason=f"error {code}")
    return NS(has_error=lambda: error is not None, error=error, metadata=NS(src_node_id=node))


def _account(replies, sent=None):
    mirror, retired = PrivacyMirror(CONFIG, list(NODES)), []
    roster = NS(node_of=NODES, num_examples={p: 50 for p in NODES})
    msgs = [NS(metadata=NS(dst_node_id=n), content={"config": {"server-round": 1}}) for n in NODES.values()]
    planned = planned_by_partition(CONFIG, roster, msgs)
    account_round(planned, NS(retire=retired.append), roster, mirror, msgs, replies, lambda _: None, sent)
    return {p: len(ledger.entries) for p, ledger in mirror.ledgers.items()}, retired, mirror


def test_only_possibly_released_updates_are_recorded():
    # 0 replied, 1 failed (ValueError in its update rule), 2 refused (budget), 3 and 4 never replied
    counts, retired, mirror = _account([_reply(100), _reply(101, code=0), _reply(102, code=BUDGET_EXHAUSTED)])
    assert counts == {0: 1, 1: 0, 2: 0, 3: 1, 4: 1}
    assert retired == [2]
    one = PrivacyLedger(planned_entries(CONFIG, {"server-round": 1}, dataset_size=50)).epsilon(CONFIG["target-delta"])
    assert mirror.round_metrics()["epsilon_max"] == pytest.approx(one, rel=1e-12)  # an accountant call
    assert mirror.round_metrics()["epsilon_mean"] == pytest.approx(3 * one / 5, rel=1e-12)


def test_nodes_the_instruction_never_reached_are_not_recorded():
    counts, _, _ = _account([_reply(100)], sent={100, 101})  # 101 dropped after it was sent
    assert counts == {0: 1, 1: 1, 2: 0, 3: 0, 4: 0}


def test_secure_aggregation_reports_the_nodes_it_sent_to():
    metered = object()
    assert instructed(metered, metered) is None
    sent = NS(report=NS(selected=(100, 102), round_trips=1))
    assert instructed(sent, metered) == {100, 102}
    aborted_before_sending = NS(report=NS(selected=(100,), round_trips=0))
    assert instructed(aborted_before_sending, metered) == set()
