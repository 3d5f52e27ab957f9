"""Upcycled-FL end to end on the in-process engine, with a grid wrapper that
records every message a client receives: no message on even rounds, half the
uploaded bytes, and the vanilla run's draws in the odd rounds."""

import io
import json
from collections import defaultdict

import pytest
from rich.console import Console

from common.config import validate
from common.records import CONFIG
from server.delegating_grid import DelegatingGrid
from server.inprocess import CLIENT_APP
from server.inprocess_grid import InProcessGrid
from server.runner import run_federation

BASE = {"num-clients": 6, "fraction-train": 0.5, "local-epochs": 4, "stragglers": 0.5, "seed": 11,
        "dataset": "synthetic", "momentum": 0.5}


class CountingGrid(DelegatingGrid):
    """Delegates to `inner`; records every message handed to a client (by partition: node ids
    change from run to run)."""

    def __init__(self, inner: InProcessGrid):
        super().__init__(inner)
        self.delivered, self.calls = [], 0
        self.partition_of = {node: int(c.node_config["partition-id"]) for node, c in inner.contexts.items()}

    def _record(self, messages):
        self.calls += 1
        for m in messages:
            config = dict(m.content[CONFIG]) if CONFIG in m.content else {}
            self.delivered.append((m.metadata.message_type, self.partition_of[m.metadata.dst_node_id], config))

    def push_messages(self, messages):
        messages = list(messages)
        self._record(messages)
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self._record(messages)
        return self.inner.send_and_receive(messages, timeout=timeout)


def run_counted(tmp_path, **overrides):
    config = validate({**BASE, "results-dir": str(tmp_path), **overrides})
    with InProcessGrid(CLIENT_APP, dict(config), int(config["num-clients"])) as inner:
        grid = CountingGrid(inner)
        out = run_federation(grid, config, Console(file=io.StringIO()))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = defaultdict(list)
    for kind, partition, config_ in grid.delivered:
        if kind == "train":
            train[config_["server-round"]].append((partition, config_.get("train-round"),
                                                   config_.get("local-epochs")))
    return grid, rows, {r: sorted(v) for r, v in train.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("upcycled")
    return {
        "vanilla": run_counted(tmp, **{"num-rounds": 6, "run-name": "vanilla"}),
        "upcycled": run_counted(tmp, **{"num-rounds": 6, "upcycled": True, "upcycled-theta": 0.5,
                                        "run-name": "upcycled"}),
    }


def test_no_client_receives_any_message_on_even_rounds(runs):
    grid, rows, train = runs["upcycled"]
    k = 3  # floor(0.5 * 6)
    assert sorted(train) == [1, 3, 5]
    assert all(len(train[r]) == k for r in train)
    enroll = [d for d in grid.delivered if d[0] != "train"]
    assert len(enroll) == 6 and all(d[0] == "query.enroll" for d in enroll)
    assert len(grid.delivered) == 6 + 3 * k  # every message there is: enrollment + odd rounds
    assert grid.calls == 1 + 3  # the grid is not even called on even rounds
    for row in rows:
        if row["round"] % 2 == 0:
            assert row["clients"] == 0 and row["bytes_down"] == 0 and row["bytes_up"] == 0
        else:
            assert row["clients"] == k and row["bytes_down"] > 0 and row["bytes_up"] > 0


def test_uploaded_bytes_over_2m_rounds_are_half_of_vanilla(runs):
    _, vanilla, _ = runs["vanilla"]
    _, upcycled, _ = runs["upcycled"]
    assert len(vanilla) == len(upcycled) == 6
    up, down = sum(r["bytes_up"] for r in upcycled), sum(r["bytes_down"] for r in upcycled)
    assert 2 * up == sum(r["bytes_up"] for r in vanilla)
    assert 2 * down == sum(r["bytes_down"] for r in vanilla)


def test_vanilla_round_m_and_upcycled_round_2m_minus_1_draw_identically(runs):
    _, vanilla_rows, vanilla = runs["vanilla"]
    _, upcycled_rows, upcycled = runs["upcycled"]
    for m in (1, 2, 3):
        assert upcycled[2 * m - 1] == vanilla[m]
        assert all(train_round == m for _, train_round, _ in vanilla[m])
    stragglers = [e for m in (1, 2, 3) for _, _, e in vanilla[m] if e is not None]
    assert stragglers and all(1 <= e <= 3 for e in stragglers)  # floor(U * 4) >= 1
    # same start, same clients, same stragglers, same minibatches: round 1 is the same run
    assert upcycled_rows[0]["accuracy"] == vanilla_rows[0]["accuracy"]
    assert upcycled_rows[0]["train_loss"] == vanilla_rows[0]["train_loss"]
    # the even round moved the model without training
    assert upcycled_rows[1]["train_loss"] is None


@pytest.mark.parametrize("strategy", ["scaffold", "fedyogi"])
def test_bytes_halved_for_other_bases(tmp_path, strategy):
    _, vanilla, _ = run_counted(tmp_path, **{"num-rounds": 4, "strategy": strategy, "run-name": "v"})
    _, upcycled, _ = run_counted(tmp_path, **{"num-rounds": 4, "strategy": strategy, "upcycled": True,
                                             "run-name": "u"})
    assert 2 * sum(r["bytes_up"] for r in upcycled) == sum(r["bytes_up"] for r in vanilla)
    assert [r["clients"] for r in upcycled] == [3, 0, 3, 0]


def _failing_rule(*_args, **_kwargs):
    raise RuntimeError("disk full")


@pytest.mark.parametrize("upcycled", [False, True], ids=["vanilla", "upcycled"])
def test_a_run_whose_every_client_update_fails_is_an_error_with_or_without_upcycled(tmp_path, monkeypatch,
                                                                                      upcycled):
    """Every client fails every training round: the run is an error, not a result. Under Upcycled-FL
    the even round after an empty odd round used to hand back a copy of the model, which the runner
    counted as an update, so the untrained initial model was written out as the result."""
    import client.updates.sgd as sgd
    from server.inprocess import run_inprocess

    monkeypatch.setattr(sgd, "sgd_update", _failing_rule)
    config = validate({"num-rounds": 2, "num-clients": 2, "dataset": "synthetic", "upcycled": upcycled,
                       "results-dir": str(tmp_path / "results"), "run-name": f"fail-{upcycled}"})
    with pytest.raises(RuntimeError, match="no round updated the model"):
        run_inprocess(config, console=Console(file=io.StringIO()), threads=1)
