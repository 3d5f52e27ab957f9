"""The secure-aggregation grid (server/secagg_grid.py + client/secagg.py) on the
in-process engine: same model as plaintext FedAvg within the quantisation
bound, dropout recovery, nothing unmasked ever reaches the server, refusals."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from rich.console import Console
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from client.secagg import RECORD, VECTOR, WORDS, secagg_params
from common.config import ConfigError, _check_secure_aggregation, defaults, validate
from server.inprocess import CLIENT_APP
from server.inprocess_grid import InProcessGrid
from common.records import model_to_arrays
from server.runner import initial_model, run_federation
from server.secagg_grid import SecureAggregationError, SecureAggregationGrid
from fault_grids import Recorder

BASE = {"num-clients": 4, "num-rounds": 3, "seed": 5, "dataset": "synthetic", "local-epochs": 1}


def run(tmp_path: Path, name: str, recorder_args: dict | None = None, **overrides):
    config = validate({**BASE, **overrides, "results-dir": str(tmp_path), "run-name": name})
    with InProcessGrid(CLIENT_APP, dict(config), int(config["num-clients"])) as grid:
        recorder = Recorder(grid, **(recorder_args or {}))
        out = run_federation(recorder, config)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return out, rows, recorder, config


def model(out: Path) -> dict[str, np.ndarray]:
    data = np.load(out / "model.npz")
    return {k: data[k] for k in data.files}


def train_round(secure: SecureAggregationGrid, nodes, model: ArrayRecord, server_round: int):
    """One strategy round through the secure grid: its replies and its report."""
    msgs = [Message(RecordDict({"arrays": model, "config": ConfigRecord({"server-round": server_round})}),
                    dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]
    return list(secure.send_and_receive(msgs, timeout=30)), secure.report


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run(tmp_path_factory.mktemp("plain"), "plain")


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    return run(tmp_path_factory.mktemp("secure"), "secure", **{"secure-aggregation": True})


def test_secure_fedavg_matches_plain_within_quantisation_bound(plain, secure):
    out_p, rows_p, _, _ = plain
    out_s, rows_s, _, config = secure
    codec = secagg_params(config).codec
    # per round the mean is within n * 2^-(f+1) / W of the exact one (W >= 1 here: weights n_i / max n_i),
    # plus float32 rounding; three rounds of local training from slightly different models
    bound = 3 * 10 * (4 * codec.step_error) + 1e-5
    for key, a in model(out_p).items():
        assert np.abs(a - model(out_s)[key]).max() <= bound, key
    for a, b in zip(rows_p, rows_s, strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=2e-3)
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-4)  # only aggregated metrics, same mean
        assert b["clients"] == 4


def test_masked_round_instructions_expire_with_the_round(secure):
    """A SuperLink neither hands out nor stores a reply to an expired instruction: with the round's
    timeout as TTL, no masked vector can wait there past the timeout, to be unmasked by the reveals."""
    _, _, rec, config = secure
    train = [m for m in rec.sent if m.metadata.message_type == MessageType.TRAIN]
    assert train and all(RECORD in m.content for m in train)
    assert {m.metadata.ttl for m in train} == {float(config["round-timeout"])}


def test_bytes_up_close_to_plaintext(plain, secure):
    _, rows_p, _, _ = plain
    _, rows_s, _, _ = secure
    for a, b in zip(rows_p, rows_s):
        assert b["bytes_up"] <= 1.1 * a["bytes_up"] + 4 * 400  # uint32 words + a small header per client


def test_server_never_receives_an_unmasked_update(plain, secure):
    _, _, rec_p, _ = plain
    _, _, rec_s, config = secure
    codec = secagg_params(config).codec
    plain_models = [r.content["arrays"] for r in rec_p.received
                    if r.metadata.message_type == MessageType.TRAIN and not r.has_error()]
    assert plain_models
    needles = [np.asarray(a.numpy()).ravel()[:8].tobytes() for rec in plain_models for a in rec.values()]
    kinds = set()
    for reply in rec_s.received:
        assert not reply.has_error()
        kinds.add(reply.metadata.message_type)
        for name, record in reply.content.items():
            if isinstance(record, ArrayRecord):
                assert name == VECTOR and list(record.keys()) == [WORDS]
                words = record[WORDS].numpy()
                assert words.dtype == np.uint32
                blob = words.tobytes()
                assert not any(n in blob for n in needles)
                # masked words are uniform mod 2^32: an unmasked encoding would sit within
                # +-clip * 2^f (= 2^29 here) of zero; masked, the median |centred word| is ~2^30
                centred = np.abs(words.view(np.int32).astype(np.int64))
                assert np.median(centred) > 2 ** 28
                assert np.mean(centred < codec.q_max // 8) < 0.2
            elif name == RECORD:
                assert set(record.keys()) <= {"run", "node", "public-key", "num-examples", "round", "context",
                                              "metric-keys", "tag", "layout", "dropped"}
            elif reply.metadata.message_type == "query.enroll":  # the roster: partition id and size
                assert name == "config" and set(record.keys()) == {"partition-id", "num-partitions", "num-examples"}
            else:
                pytest.fail(f"unexpected record {name!r} in a reply under secure aggregation")
    assert kinds == {"query.enroll", "query.secagg_enroll", MessageType.TRAIN}


def test_dropout_is_recovered_and_an_unusable_vector_aborts(tmp_path, plain):
    # round 2: partition 1's reply is lost (timeout): dropped, its masks revealed, the round completes.
    # round 3: partition 2's vector arrives corrupted: the server holds it, so revealing its masks would
    # unmask it; the round aborts (model unchanged) and the node is left out of round 4.
    out, rows, rec, config = run(tmp_path, "drop", {"drop": {2: 1}, "corrupt": {3: 2}},
                                 **{"secure-aggregation": True, "num-rounds": 4})
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert [(r["secagg_survivors"], r["secagg_round_trips"]) for r in rows] == [(4, 1), (3, 2), (0, 1), (3, 1)]
    reveals = [r for r in rec.received if r.metadata.message_type == "query.secagg_reveal"]
    assert len(reveals) == 3 and not any(r.has_error() for r in reveals)  # round 2's 3 survivors only
    assert rows[1]["accuracy"] > 0.3 and rows[2]["accuracy"] == rows[1]["accuracy"]
    assert rows[3]["accuracy"] >= rows[2]["accuracy"] - 0.05
    assert all(np.isfinite(v).all() for v in model(out).values())


def test_dropout_equals_plain_fedavg_over_the_survivors(tmp_path):
    """One round, 4 nodes, one lost reply: the aggregate is the plaintext FedAvg of the other three."""
    config = validate({**BASE, "num-rounds": 1, "secure-aggregation": True})
    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        nodes = list(grid.get_node_ids())
        rec = Recorder(grid, drop={1: 0})
        secure = SecureAggregationGrid(rec, config, log=lambda s: None)
        secure.enroll(10.0)
        model = model_to_arrays(initial_model(config))
        msgs = [Message(RecordDict({"arrays": model, "config": ConfigRecord({"server-round": 1})}),
                        dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]
        replies = secure.send_and_receive(msgs, timeout=30)
        assert secure.report.dropped == (nodes[0],) and secure.report.round_trips == 2
        survivors = sorted(nodes[1:])
        assert sorted(r.metadata.src_node_id for r in replies) == survivors
        # the same instruction in plaintext to the survivors' nodes (deterministic local training)
        plain_cfg = validate({**BASE, "num-rounds": 1})
        with InProcessGrid(CLIENT_APP, dict(plain_cfg), 4) as plain_grid:
            plain_replies = list(plain_grid.send_and_receive(
                [Message(RecordDict({"arrays": model, "config": ConfigRecord({"server-round": 1})}),
                         dst_node_id=n, message_type=MessageType.TRAIN) for n in plain_grid.get_node_ids()][1:]))
        weights = np.array([r.content["metrics"]["num-examples"] for r in plain_replies], dtype=np.float64)
        codec = secagg_params(config).codec
        bound = 3 * codec.step_error / (weights.sum() / max(secure.num_examples.values())) + 1e-6
        for key in model.keys():
            exact = sum(w * r.content["arrays"][key].numpy().astype(np.float64)
                        for w, r in zip(weights, plain_replies)) / weights.sum()
            for r in replies:
                assert np.abs(r.content["arrays"][key].numpy() - exact).max() <= bound
        metrics = replies[0].content["metrics"]
        assert metrics["num-examples"] == 1 and metrics["secagg-clients"] == 3 and metrics["secagg-dropped"] == 1
        assert metrics["secagg-examples"] == pytest.approx(weights.sum())
        exact_loss = float((weights * [r.content["metrics"]["train-loss"] for r in plain_replies]).sum() / weights.sum())
        assert metrics["train-loss"] == pytest.approx(exact_loss, abs=1e-4)


def test_too_few_survivors_leaves_the_model_unchanged(tmp_path):
    config = validate({**BASE, "num-clients": 2, "num-rounds": 1, "secure-aggregation": True})
    with InProcessGrid(CLIENT_APP, dict(config), 2) as grid:
        secure = SecureAggregationGrid(Recorder(grid, drop={1: 0}), config, log=lambda s: None)
        secure.enroll(10.0)
        model = model_to_arrays(initial_model(config))
        msgs = [Message(RecordDict({"arrays": model, "config": ConfigRecord({"server-round": 1})}),
                        dst_node_id=n, message_type=MessageType.TRAIN) for n in grid.get_node_ids()]
        assert secure.send_and_receive(msgs, timeout=10) == []
        assert "fewer than min_survivors" in secure.report.aborted
        assert list(secure.report.problems.values()) == ["no reply before the timeout"]


def test_refusals():
    with pytest.raises(ConfigError, match="needs the individual replies"):
        _check_secure_aggregation({**defaults(), "secure-aggregation": True, "strategy": "fedmedian"})
    with pytest.raises(ConfigError, match="at least secagg-min-survivors"):
        validate({"secure-aggregation": True, "num-clients": 10, "fraction-train": 0.1})
    with pytest.raises(ConfigError, match="no headroom"):
        validate({"secure-aggregation": True, "num-clients": 8, "secagg-clip": 2.0 ** 30})
    assert validate({"secure-aggregation": True, "strategy": "scaffold"})["secure-aggregation"] is True
    config = validate({**BASE, "secure-aggregation": True})
    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        secure = SecureAggregationGrid(grid, config, log=lambda s: None)
        node = list(grid.get_node_ids())[0]
        with pytest.raises(SecureAggregationError, match="federated evaluation"):
            secure.send_and_receive([Message(RecordDict(), dst_node_id=node, message_type=MessageType.EVALUATE)])
        with pytest.raises(SecureAggregationError, match="bypasses"):
            secure.push_messages([Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)])


def test_client_refuses_unmasked_train_and_survives_fresh_processes(tmp_path):
    """A node with secure-aggregation on never answers a plain train message, and its protocol
    state lives only in Context.state (serialised between messages, as in deployment)."""
    config = validate({**BASE, "secure-aggregation": True})
    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        node = list(grid.get_node_ids())[0]
        reply = grid.send_and_receive([Message(RecordDict({"arrays": ArrayRecord(), "config": ConfigRecord()}),
                                               dst_node_id=node, message_type=MessageType.TRAIN)])
        assert reply[0].has_error() and "refusing to send an unmasked update" in reply[0].error.reason

    # every message in a "fresh process": Context.state goes through Flower's protobuf serialisation
    contexts = {}
    with InProcessGrid(CLIENT_APP, dict(config), 4) as inner:
        class Fresh(Recorder):
            def send_and_receive(self, messages, *, timeout=None):
                replies = super().send_and_receive(messages, timeout=timeout)
                for n, ctx in inner.contexts.items():
                    ctx.state = recorddict_from_proto(recorddict_to_proto(ctx.state))
                    contexts[n] = ctx
                return replies

        out = run_federation(Fresh(inner), config.replace(num_rounds=2, results_dir=str(tmp_path), run_name="fresh"))
    assert all("secagg-client" in c.state for c in contexts.values())
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["clients"] == 4


@pytest.mark.parametrize("overrides", [
    {"strategy": "fedavgm"}, {"strategy": "fedprox"}, {"strategy": "scaffold"}, {"strategy": "feddyn"},
    {"strategy": "fedyogi"}, {"strategy": "pfedme"}, {"strategy": "fedavg", "upcycled": True},
], ids=lambda o: "upcycled-fedavg" if o.get("upcycled") else o["strategy"])
def test_every_weighted_sum_strategy_runs_unchanged(tmp_path, overrides):
    """Same model with and without secure aggregation (SCAFFOLD's control delta and FedDyn's model are
    unit-weight records; Upcycled's even round contacts nobody)."""
    kw = {"num-rounds": 2, **overrides}
    out_p, rows_p, _, _ = run(tmp_path, "p", **kw)
    out_s, rows_s, _, _ = run(tmp_path, "s", **{**kw, "secure-aggregation": True})
    for key, a in model(out_p).items():
        np.testing.assert_allclose(model(out_s)[key], a, atol=2e-4, err_msg=key)
    assert [r["accuracy"] for r in rows_s] == pytest.approx([r["accuracy"] for r in rows_p], abs=5e-3)


def _tamper_train(mode: str, reply: Message) -> None:
    cfg = reply.content[RECORD]
    if mode == "empty vector":
        reply.content[VECTOR] = ArrayRecord({WORDS: Array(dtype="<u4", shape=(3,), stype="numpy.ndarray",
                                                          data=b"")})
    elif mode == "int node id":  # bytes(2**70) would try to allocate 2**70 bytes
        cfg["node"] = 2 ** 70
    elif mode == "huge layout":  # np.prod in int64 wraps [2**32, 2**32] to 0
        layout = json.loads(str(cfg["layout"]))
        layout["records"].append({"name": "x", "delta": False, "unit": False, "arrays": [["a", "<f4", [2**32, 2**32]]]})
        cfg["layout"] = json.dumps(layout)
    elif mode == "deep json":
        cfg["metric-keys"] = "[" * 100_000
    elif mode == "string dtype":
        layout = json.loads(str(cfg["layout"]))
        layout["records"][0]["arrays"][0][1] = "<U1"
        cfg["layout"] = json.dumps(layout)
    elif mode == "layout re-serialised in transit":  # the same layout parsed, but the tag covers the text
        cfg["layout"] = json.dumps(json.loads(str(cfg["layout"])), indent=1)


class Tamper(Recorder):
    """Tampers with the first train reply of round 1 only."""

    def __init__(self, inner, mode):
        super().__init__(inner)
        self.mode = mode

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        if self.train_round == 1 and messages and messages[0].metadata.message_type == MessageType.TRAIN:
            _tamper_train(self.mode, replies[0])
        return replies


@pytest.mark.parametrize("mode", ["empty vector", "int node id", "huge layout", "deep json", "string dtype",
                                  "layout re-serialised in transit"])
def test_one_hostile_reply_never_crashes_the_server_or_unmasks_anyone(mode):
    config = validate({**BASE, "num-rounds": 2, "secure-aggregation": True})
    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        rec = Tamper(grid, mode)
        secure = SecureAggregationGrid(rec, config, log=lambda s: None)
        secure.enroll(10.0)
        model = model_to_arrays(initial_model(config))
        replies, report = train_round(secure, grid.get_node_ids(), model, 1)
        bad = next(r.metadata.src_node_id for r in rec.received if r.metadata.message_type == MessageType.TRAIN)
        assert replies == [] and report.aborted and list(report.problems) == [bad]  # no model from round 1
        assert bad in secure.excluded
        assert not any(r.metadata.message_type == "query.secagg_reveal" for r in rec.received)  # nobody unmasked
        replies, report = train_round(secure, grid.get_node_ids(), model, 2)  # left out; the other three aggregate
        assert len(replies) == 3 and report.survivors == tuple(sorted(set(grid.get_node_ids()) - {bad}))


class WithholdReveals(Recorder):
    """Round 1: the first node's train reply is lost, and the reveals of the nodes in `silent` are too."""

    def __init__(self, inner, silent: int):
        super().__init__(inner, drop={1: 0})
        self.silent = silent

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        if messages and messages[0].metadata.message_type == "query.secagg_reveal":
            replies = replies[self.silent:]
        return replies


@pytest.mark.parametrize("silent", [1, 3])
def test_a_survivor_withholding_its_reveal_is_left_out_unless_nobody_revealed(silent):
    config = validate({**BASE, "num-rounds": 2, "secure-aggregation": True, "secagg-min-survivors": 2})
    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        rec = WithholdReveals(grid, silent)
        secure = SecureAggregationGrid(rec, config, log=lambda s: None)
        secure.enroll(10.0)
        model = model_to_arrays(initial_model(config))
        nodes = list(grid.get_node_ids())
        replies, report = train_round(secure, nodes, model, 1)
        assert replies == [] and "did not reveal" in report.aborted
        reveals = [r.metadata.src_node_id for r in rec.received if r.metadata.message_type == "query.secagg_reveal"]
        withheld = set(reveals[:silent])
        if silent == 3:  # every survivor: the network's fault as likely as theirs, nobody is left out
            assert secure.excluded == {}
        else:
            assert set(secure.excluded) == withheld and "did not reveal" in secure.excluded[reveals[0]]
        replies, report = train_round(secure, nodes, model, 2)
        assert sorted(report.survivors) == sorted(set(nodes) - set(secure.excluded))
        assert len(replies) == len(report.survivors) and not report.aborted


def test_a_bad_enrollment_is_refused_without_crashing():
    config = validate({**BASE, "num-rounds": 1, "secure-aggregation": True})

    class BadEnroll(Recorder):
        def send_and_receive(self, messages, *, timeout=None):
            replies = list(self.inner.send_and_receive(list(messages), timeout=timeout))
            if replies and replies[0].metadata.message_type == "query.secagg_enroll":
                replies[0].content[RECORD]["num-examples"] = float("inf")
                replies[1].content[RECORD]["public-key"] = 2 ** 40
            return replies

    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        logs = []
        secure = SecureAggregationGrid(BadEnroll(grid), config, log=logs.append)
        secure.enroll(10.0)
        assert len(secure.server.enrolled) == 2
        assert sum("bad enrollment" in line for line in logs) == 2


@pytest.mark.timeout(180)
def test_a_node_excluded_for_the_run_is_no_longer_sampled(tmp_path):
    """A node whose masked update is unusable is left out of every later round. The strategy must stop
    sampling it: otherwise each round that draws it runs with one client fewer than fraction-train says
    (session 18's note; here 2 of 3 instead of 3)."""
    config = validate({**BASE, "num-clients": 6, "fraction-train": 0.5, "num-rounds": 6, "seed": 3,
                       "secure-aggregation": True, "results-dir": str(tmp_path), "run-name": "excluded"})
    printed = io.StringIO()
    with InProcessGrid(CLIENT_APP, dict(config), 6) as grid:
        out = run_federation(Tamper(grid, "empty vector"), config, Console(file=printed))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["secagg_survivors"] == 0  # round 1 aborted on the unusable update
    assert [r["clients"] for r in rows[1:]] == [3] * 5
    assert "is no longer selected" in printed.getvalue()


def test_a_survivor_claiming_more_examples_than_it_enrolled_with_leaves_the_model_unchanged(monkeypatch):
    """Plaintext replies with num-examples above the enrolled count are dropped (server/replies.py); under
    secure aggregation the weight is inside the masked vector and was never checked: one node claiming 3x
    its examples pulled the decoded mean towards its own update. The decoded total weight is the check."""
    import client.secagg as client_secagg

    honest = client_secagg.encode_reply
    claimed = []

    def inflated(reply, instruction, unit_records, weight_scale, codec_scale):
        vector, w, metrics, layout = honest(reply, instruction, unit_records, weight_scale, codec_scale)
        if not claimed:  # the first node to encode, once
            claimed.append(w)
            scale = 3.0  # within the codec's clip bound, which would refuse 100x
            return vector * scale, w * scale, metrics, layout  # w * u and w: both scaled, as a liar would
        return vector, w, metrics, layout

    monkeypatch.setattr(client_secagg, "encode_reply", inflated)
    config = validate({**BASE, "num-rounds": 1, "secure-aggregation": True})
    logs = []
    with InProcessGrid(CLIENT_APP, dict(config), 4) as grid:
        secure = SecureAggregationGrid(grid, config, log=logs.append)
        secure.enroll(10.0)
        replies, _ = train_round(secure, grid.get_node_ids(), model_to_arrays(initial_model(config)), 1)
    assert claimed and replies == [] and any("more than the survivors enrolled with" in line for line in logs), logs


def test_a_round_whose_decoded_sum_is_unusable_counts_every_reply_failed(tmp_path, monkeypatch):
    """Under secure aggregation a row's `failed` was selected - survivors: a round whose decoded sum is
    refused (here a survivor weighed itself up) used no reply, yet counted 0 failed."""
    import client.secagg as client_secagg

    honest = client_secagg.encode_reply

    def inflated_in_round_1(reply, instruction, unit_records, weight_scale, codec_scale):
        vector, w, metrics, layout = honest(reply, instruction, unit_records, weight_scale, codec_scale)
        if int(instruction["config"]["server-round"]) == 1:
            return vector * 3.0, w * 3.0, metrics, layout
        return vector, w, metrics, layout

    monkeypatch.setattr(client_secagg, "encode_reply", inflated_in_round_1)
    _, rows, _, _ = run(tmp_path, "w", **{"num-rounds": 2, "secure-aggregation": True})
    assert [(r["clients"], r["failed"]) for r in rows] == [(4, 4), (4, 0)], rows


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
ALL_OUT_OF_RANGE = {"num-clients": 3, "num-rounds": 1, "seed": 7, "dataset": "synthetic",
                    "secure-aggregation": True, "secagg-clip": 1.0, "lr": 30.0, "run-name": "rv"}


def test_a_run_whose_every_round_secure_aggregation_aborted_says_so(tmp_path):
    """Every client's update left the codec range (lr 30, secagg-clip 1): each replied without a vector, the
    round was aborted, and the run ended "no round updated the model; no client replied" (pointing at the
    network, not at secagg-clip); the abort line said "0 of 3 selected nodes replied"."""
    config = validate({**ALL_OUT_OF_RANGE, "results-dir": str(tmp_path / "r"), "state-dir": str(tmp_path / "s")})
    buffer = io.StringIO()
    with InProcessGrid(CLIENT_APP, dict(config), 3) as grid, pytest.raises(RuntimeError) as info:
        run_federation(grid, config, Console(file=buffer, width=400), round_lines=False)
    assert buffer.getvalue().count("client could not mask its update") == 3
    assert "0 of 3 selected nodes sent a masked update" in buffer.getvalue()
    assert "secure aggregation aborted: round 1 aborted" in str(info.value)
    assert "codec range [-1, 1] (secagg-clip)" in str(info.value)


class ExpiresOne:
    """In the first train round, node[0]'s reply is the one Flower's SuperLink hands the ServerApp when an
    instruction expired unanswered: an error from SUPERLINK_NODE_ID (1) whose reply_to is the instruction."""

    def __init__(self, inner):
        self.inner, self.done = inner, False

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

        messages = list(messages)
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        if self.done or not messages or messages[0].metadata.message_type != "train":
            return replies
        self.done = True
        victim = sorted(self.inner.get_node_ids())[0]
        instruction = next(m for m in messages if m.metadata.dst_node_id == victim)
        expired = create_message_error_unavailable_res_message(instruction.metadata, "msg_unavail")
        return [r for r in replies if r.metadata.src_node_id != victim] + [expired]

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_superlinks_answer_for_an_expired_instruction_names_the_node(tmp_path):
    """Under `flwr run` each expired train instruction was logged "ignoring an unexpected reply from node 1":
    there is no node 1 (the SuperLink's own id), and the node whose instruction expired went unnamed."""
    config = validate({"num-clients": 3, "num-rounds": 1, "seed": 7, "dataset": "synthetic",
                       "secure-aggregation": True, "run-name": "exp", "results-dir": str(tmp_path / "r"),
                       "state-dir": str(tmp_path / "s")})
    buffer = io.StringIO()
    with InProcessGrid(CLIENT_APP, dict(config), 3) as grid:
        run_federation(ExpiresOne(grid), config, Console(file=buffer, width=400), round_lines=False)
        victim = sorted(grid.get_node_ids())[0]
    log = buffer.getvalue()
    assert f"the SuperLink answered for node {victim}" in log and f"node {victim} did not reply; dropped" in log
    assert "unexpected reply from node 1" not in log
