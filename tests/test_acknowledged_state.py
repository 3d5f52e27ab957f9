"""SCAFFOLD's c_i and FedDyn's g_i move only with the replies the server aggregated
(client/updates/acknowledged.py): a lost reply (a timeout, a secure-aggregation dropout, a round the
server lost to a crash) leaves node and server in step. The invariant checked: the server's state
(SCAFFOLD's c, FedDyn's h) equals the mean over all N nodes of their states."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

import client.node
import server.runner
from client.updates.acknowledged import ACKNOWLEDGED, keep, settled
from common.config import validate
from server.inprocess import CLIENT_APP
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation
from fault_grids import DiesAfter, Killed, Recorder

BASE = {"num-clients": 4, "num-rounds": 3, "seed": 5, "dataset": "synthetic", "local-epochs": 1}
STATE_OF = {"scaffold": ("scaffold-control", "control"), "feddyn": ("feddyn-grad", "h")}


def _record(value: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.full(2, value, dtype=np.float32))})


def _value(record: ArrayRecord | None) -> float | None:
    return None if record is None else float(record["w"].numpy()[0])


def test_a_pending_state_is_kept_only_if_the_server_acknowledges_its_round():
    state = RecordDict({"s": _record(1.0)})
    keep(state, "s", _record(2.0), ConfigRecord({"server-round": 3, ACKNOWLEDGED: 1}))
    assert _value(state["s"]) == 1.0  # pending until acknowledged
    assert _value(settled(state, "s", ConfigRecord({"server-round": 5, ACKNOWLEDGED: 3}))) == 2.0
    keep(state, "s", _record(3.0), ConfigRecord({"server-round": 5, ACKNOWLEDGED: 3}))
    assert _value(settled(state, "s", ConfigRecord({"server-round": 7, ACKNOWLEDGED: 3}))) == 2.0  # round 5 lost
    assert set(state.keys()) == {"s"}  # nothing pending is left behind


def test_a_server_that_does_not_acknowledge_keeps_the_state_at_once():
    state = RecordDict()
    keep(state, "s", _record(2.0), ConfigRecord({"server-round": 1}))
    assert _value(settled(state, "s", ConfigRecord({"server-round": 2}))) == 2.0


def _run(tmp_path, monkeypatch, strategy: str, grid_of, **extra):
    """Run, returning (the server's strategy, {partition: the node's state as the server knows it})."""
    built = []
    original = server.runner.build_strategy
    monkeypatch.setattr(server.runner, "build_strategy", lambda *a, **k: built.append(original(*a, **k)) or built[-1])
    config = validate({**BASE, "strategy": strategy, "results-dir": str(tmp_path), "run-name": strategy, **extra})
    client.node._local.clear()
    with InProcessGrid(CLIENT_APP, dict(config), int(config["num-clients"])) as grid:
        run_federation(grid_of(grid), config)
        contexts = grid.contexts
    key, _ = STATE_OF[strategy]
    s = built[-1].base if hasattr(built[-1], "base") else built[-1]
    states = {p: settled(contexts[node].state, key, ConfigRecord({ACKNOWLEDGED: s.acknowledged.get(p, 0)}))
              for p, node in s.roster.node_of.items()}
    return s, states


def _assert_in_step(strategy_obj, states, strategy: str, atol: float) -> None:
    _, attr = STATE_OF[strategy]
    server_state = getattr(strategy_obj, attr)
    n = len(states)
    for name, value in server_state.items():
        mean = sum(np.asarray(s[name].numpy(), np.float64) for s in states.values() if s is not None) / n
        np.testing.assert_allclose(np.asarray(value, np.float64), mean, atol=atol, rtol=0, err_msg=name)


@pytest.mark.parametrize("strategy", ["scaffold", "feddyn"])
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure-aggregation"])
def test_a_lost_reply_leaves_node_and_server_in_step(tmp_path, monkeypatch, strategy, secure):
    """One node's reply is lost in round 2 and another's in round 3 (as past the timeout). Under secure
    aggregation each is dropped and the survivors' masks with it revealed; either way the server
    aggregates the other three."""
    s, states = _run(tmp_path, monkeypatch, strategy, lambda g: Recorder(g, drop={2: 1, 3: 2}),
                     **{"secure-aggregation": secure})
    assert sorted(s.acknowledged.values()) == [2, 3, 3, 3]  # round 3's lost reply: last aggregated in round 2
    _assert_in_step(s, states, strategy, atol=2e-4 if secure else 1e-6)  # secure: the codec's quantisation


def test_a_round_lost_with_the_server_is_not_kept_by_nodes_that_stayed_up(tmp_path, monkeypatch):
    """The server dies after round 2's replies, before its checkpoint; the nodes keep running (same
    Contexts) and the resumed server redoes round 2 from its round-1 checkpoint."""
    config = validate({**BASE, "strategy": "scaffold", "checkpoint": True, "results-dir": str(tmp_path),
                       "run-name": "crash"})
    built = []
    original = server.runner.build_strategy
    monkeypatch.setattr(server.runner, "build_strategy", lambda *a, **k: built.append(original(*a, **k)) or built[-1])
    client.node._local.clear()
    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        with pytest.raises(Killed):
            run_federation(DiesAfter(grid, 2, after_replies=True), config)
        run_federation(grid, config)
        s = built[-1]
        states = {p: settled(grid.contexts[node].state, "scaffold-control",
                             ConfigRecord({ACKNOWLEDGED: s.acknowledged.get(p, 0)}))
                  for p, node in s.roster.node_of.items()}
    _assert_in_step(s, states, "scaffold", atol=1e-6)
