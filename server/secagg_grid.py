"""The secure-aggregation grid: a Flower `Grid` between a strategy and the real grid.

    strategy --> SecureAggregationGrid --> MeteredGrid --> Flower's grid / InProcessGrid

The strategy's code is unchanged: it sends its `train` messages and gets
replies. Underneath, this grid runs the masking protocol of `common/secagg`
(client side: `client/secagg.py`), and the server never holds an unmasked
update or an individual client's metrics.

Messages and round trips
------------------------
* Enrollment, once per run (`enroll()`, called by the runner right after the
  roster; again, for new nodes only, if a train message names a node not yet
  enrolled): one `query.secagg_enroll` round trip to every connected node,
  carrying a fresh random 63-bit protocol run id and the parameters'
  fingerprint. Replies: each node's X25519 public key and its training-set
  size. The server keeps the directory of public keys; it travels to each
  node with that node's next train message (and again after any failure of
  the node), so enrollment costs one round trip, not two.
* A round, nobody drops: ONE round trip. Each train message gets a `secagg`
  ConfigRecord: protocol run id, round t (this grid's own counter, strictly
  increasing), the selected set (the nodes the strategy addressed), the weight
  scale (the largest enrolled training-set size; sizes are self-reported, as in
  plaintext FedAvg, so a node claiming a huge one shrinks every other weight
  towards the fixed-point step), the records to weight by 1
  instead of by examples, and the directory digest (plus the directory itself
  when needed). Each node replies with one masked vector of uint32/uint64 words
  instead of its records (`client/secagg.py` for what it encodes), its masks
  bound to a digest of these announced fields (`announcement_digest`). The train
  messages carry the round timeout as their TTL: a reply that misses it is
  refused by the SuperLink instead of waiting there to be unmasked by the
  reveals (`common/secagg/protocol.py`, threat model).
* Dropouts: nodes that did not reply in time, replied with an error, or
  replied without a vector (a value out of the codec range, reported by the
  client) are dropped for the round, with a log line naming the node and the
  reason. If at least `secagg-min-survivors` remain, ONE more round trip
  (`query.secagg_reveal`) asks every survivor for its summed masks with the
  dropped nodes; otherwise, or if a survivor does not reveal, the round is
  aborted: the strategy gets no reply and the model stays unchanged. A
  survivor that withholds its reveal while others reveal is left out of later
  rounds (else one such node aborts every round with a dropout); when no
  survivor reveals, nobody is blamed.
* A vector that arrives but cannot be summed (malformed, fails
  authentication, a layout or metric names other than the round's most
  common ones) is never treated as a dropout: the server holds it, and the
  survivors' reveals would unmask it. The round aborts instead (model
  unchanged) and its sender is left out of later rounds, so that one node
  cannot abort them all.

The synthetic replies (the convention)
--------------------------------------
The server decodes the sums over the survivors S: sum_i w_i d_i (d_i the
client's delta to the model it was sent, w_i = n_i / n_max), W = sum_i w_i,
sum_i u_i for unit-weight records, and sum_i w_i m_i per metric. It hands the
strategy |S| identical replies, one per survivor s, each with s's reply
metadata (src node id = s, reply-to = s's instruction), holding:

* each ArrayRecord of the clients' layout, in their order: the weighted mean
  global + sum_i w_i d_i / W (examples-weighted records), or sum_i u_i / |S|
  (unit-weight records; plus the global record of that name if there is one),
  cast back to each array's dtype;
* one MetricRecord: `num-examples` = 1, each metric's examples-weighted mean
  sum_i w_i m_i / W, and `secagg-clients` = |S|, `secagg-dropped`,
  `secagg-examples` = W * n_max (the round's total training examples, as decoded: each weight is on the codec's
  fixed-point grid, so it is within |S| * n_max * 2^-frac_bits of the true count).

Error replies of the inner grid (a client that raised, or refused the round
for its privacy budget) are passed up unchanged after the synthetic replies:
they carry no data, and the runner needs them (it stops selecting a client
that refuses for its budget).

Why replicas of the mean rather than one reply: every weighted-sum strategy
then aggregates exactly what it would have without secure aggregation.
FedAvg-family averages of |S| identical arrays are that array (any weights);
FedDyn's unweighted sum_i w_i and count |P| come out as |S| * mean and |S|
(its model record is unit-weight); SCAFFOLD's sum_i delta c_i is |S| times
the unit-weight mean. `num-examples` = 1 passes the runner's reply screening
(positive, never above a node's enrolled size) and does not change any mean.
Flower's SecAgg+ does the same (every FitRes is overwritten by the aggregate).
Per-client values reported through metrics (pFedMe's personal accuracy)
become the round's mean: only aggregated metrics exist here.

Accuracy: each decoded value is within `codec.sum_error_bound(|S|)` of the
exact sum (quantisation step 2^-f; `client.secagg.secagg_params`), so a mean
is within that / W (model records) of the plaintext weighted mean with each
weight rounded to the step 2^-f (W decodes exactly), or within that / |S| of
the plain mean (unit-weight records: each client divides them by its weight
as rounded, so each enters the sum exactly once), plus the float32 rounding
of the final cast.

Refused here: `evaluate` messages (their replies are per-client metrics) and
`push_messages` of train messages (only `send_and_receive` runs the
protocol). Which strategies may run on this grid is checked at config
validation (`common.config.SECAGG_STRATEGIES`).
"""

from __future__ import annotations

import copy
import json
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid

from client.secagg import (
    ENROLL_TYPE,
    RECORD,
    REVEAL_TYPE,
    VECTOR,
    as_bytes,
    directory_digest,
    directory_fields,
    array_size,
    flatten,
    from_u64b,
    ids_bytes,
    layout_size,
    mask_reveal_from_content,
    masked_update_from_content,
    reveal_request_to_content,
    same_structure,
    secagg_params,
    u64b,
    unflatten,
)
from common.number_checks import is_int
from common.records import NUM_EXAMPLES
from common.secagg import EnrollRequest, MaskedUpdate, RoundAborted, SecAggServer
from server.delegating_grid import DelegatingGrid
from server.strategies.chain import declared

# Records that enter the sum with weight 1 instead of the client's examples,
# per strategy (a strategy object may override with `secagg_unit_records`).
UNIT_RECORDS: dict[str, tuple[str, ...]] = {
    "feddyn": ("arrays",),  # x <- (1/|P|) sum_i w_i - h/alpha: unweighted
    "scaffold": ("control-delta",),  # c <- c + (1/N) sum_i delta c_i: unweighted
    # Hu et al.: (1/r) sum_i theta_i, unweighted, as the /r credit assumes (weighted, a large client's update
    # would be hidden by less than r clients' noise: the smaller ones' is scaled down in the sum)
    "dpfedavg-hu": ("arrays",),
}


class SecureAggregationError(RuntimeError):
    """A use of the grid secure aggregation cannot serve (evaluate messages, inconsistent instructions)."""


@dataclass
class RoundReport:
    """What happened in the latest secure round (for logs, tests and benchmarks)."""

    round: int = 0
    selected: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()
    problems: dict[int, str] = field(default_factory=dict)
    round_trips: int = 0
    aborted: str = ""
    seconds_decode: float = 0.0


def unit_records_for(strategy: Any, strategy_name: str) -> tuple[str, ...]:
    records = declared(strategy, "secagg_unit_records")
    return tuple(records) if records is not None else UNIT_RECORDS.get(strategy_name, ())


class SecureAggregationGrid(DelegatingGrid):
    """Runs the masking protocol inside `send_and_receive` (module docstring)."""

    def __init__(self, inner: Grid, config: Mapping[str, Any], *, log: Callable[[str], None] = print,
                 unit_records: Iterable[str] = (), run_id: int | None = None,
                 sizes: Mapping[int, int] | None = None):
        super().__init__(inner)
        self.sizes = dict(sizes) if sizes is not None else None  # node -> its roster size: the most it may claim
        self.params = secagg_params(config)
        self.protocol_run = int(run_id) if run_id is not None else secrets.randbits(63)
        self.server = SecAggServer(self.protocol_run, self.params)
        self.unit_records = tuple(unit_records)
        self.log = log
        self.enroll_timeout = float(config.get("node-wait-timeout", 120.0))
        self.num_examples: dict[int, int] = {}
        self.weight_scale = 0.0
        self.round = 0
        self.enrollments = 0  # enrollment round trips so far
        self.report = RoundReport()
        self._has_directory: set[int] = set()
        self.excluded: dict[int, str] = {}  # node -> why it is left out (_exclude, _reveal)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self._refuse(messages, "push_messages")
        return self.inner.push_messages(messages)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if not messages:
            return []
        train = [m for m in messages if m.metadata.message_type == MessageType.TRAIN]
        if not train:
            self._refuse(messages, "send_and_receive")
            return self.inner.send_and_receive(messages, timeout=timeout)
        if len(train) != len(messages):
            raise SecureAggregationError("train messages cannot be mixed with other messages under secure aggregation")
        return self._secure_round(train, timeout)

    def _refuse(self, messages: list[Message], how: str) -> None:
        for m in messages:
            kind = m.metadata.message_type
            if kind == MessageType.TRAIN:
                raise SecureAggregationError(f"{how} of train messages bypasses secure aggregation; use send_and_receive")
            if kind.split(".")[0] == MessageType.EVALUATE:
                raise SecureAggregationError(
                    "federated evaluation is not available under secure aggregation: its replies are per-client "
                    "metrics (evaluate the global model on the server instead)")

    # -- enrollment ---------------------------------------------------------------
    def enroll(self, timeout: float | None = None, nodes: Iterable[int] | None = None) -> None:
        """Enroll every connected node not enrolled yet (one `query.secagg_enroll` round trip)."""
        nodes = sorted(set(self.inner.get_node_ids() if nodes is None else nodes) - set(self.server.enrolled))
        if not nodes:
            return
        ask = ConfigRecord({"run": u64b(self.protocol_run), "params": self.params.fingerprint()})
        msgs = [Message(RecordDict({RECORD: ConfigRecord(dict(ask))}), dst_node_id=n, message_type=ENROLL_TYPE)
                for n in nodes]
        replies = list(self.inner.send_and_receive(msgs, timeout=timeout or self.enroll_timeout))
        self.enrollments += 1
        added = []
        for reply in replies:
            src = reply.metadata.src_node_id
            if src not in nodes:
                continue
            if reply.has_error():
                self.log(f"secure aggregation: node {src} did not enroll: {_short(reply.error.reason)}")
                continue
            try:
                cfg = reply.content[RECORD]
                req = EnrollRequest(from_u64b(cfg["run"]), from_u64b(cfg["node"]),
                                    as_bytes(cfg["public-key"], "public-key"))
                if req.node_id != src:
                    raise ValueError(f"enrollment names node {req.node_id}")
                n_ex = cfg["num-examples"]
                if not is_int(n_ex) or n_ex < 0:
                    raise ValueError(f"num-examples must be a non-negative integer, got {n_ex!r}")
                if self.sizes is not None and n_ex > self.sizes.get(src, -1):  # it sets every node's weight scale
                    raise ValueError(f"num-examples {n_ex} is more than the node enrolled with "
                                     f"({self.sizes.get(src, 'not enrolled')})")
                self.server.enroll(req)
            except Exception as exc:  # adversarial content can raise anything: never crash on one reply
                self.log(f"secure aggregation: node {src} sent a bad enrollment: {exc}")
                continue
            self.num_examples[src] = n_ex
            added.append(src)
        if added:
            self._has_directory.clear()  # the directory changed: everyone gets the new one
            self.weight_scale = float(max(max(self.num_examples.values()), 1))
        missing = sorted(set(nodes) - set(added))
        self.log(f"secure aggregation: {len(self.server.enrolled)} nodes enrolled (protocol run "
                 f"{self.protocol_run}, {self.params.codec.mod_bits}-bit words, fixed point 2^-"
                 f"{self.params.codec.frac_bits}, bound {self.params.codec.clip:g})"
                 + (f"; not enrolled: {missing}" if missing else ""))

    # -- a round --------------------------------------------------------------------
    def _references(self, by_node: dict[int, Message]) -> dict[str, ArrayRecord]:
        """The ArrayRecords every selected node was sent (they must be the same for all)."""
        nodes = list(by_node)
        first = by_node[nodes[0]].content
        refs = {name: rec for name, rec in first.items() if isinstance(rec, ArrayRecord)}
        for n in nodes[1:]:
            content = by_node[n].content
            for name, rec in refs.items():
                other = content.get(name)
                if other is rec:
                    continue
                if not isinstance(other, ArrayRecord) or not same_structure(rec, other) or not all(
                        np.array_equal(rec[k].numpy(), other[k].numpy()) for k in rec.keys()):
                    raise SecureAggregationError(
                        f"record {name!r} differs between the nodes of one round: secure aggregation needs every "
                        "selected node to get the same model")
        return refs

    def _check_layout(self, layout_json: str, refs: dict[str, ArrayRecord]) -> dict[str, Any]:
        layout = json.loads(layout_json)
        if not isinstance(layout, dict) or not isinstance(layout.get("records"), list) or not layout["records"]:
            raise ValueError("layout has no records")
        if not isinstance(layout.get("metric-record"), str):
            raise ValueError("layout names no metric record")
        for rec in layout["records"]:
            name = rec["name"]
            if not isinstance(name, str) or name in (RECORD, layout["metric-record"]):
                raise ValueError(f"bad record name {name!r}")
            if bool(rec["unit"]) != (name in self.unit_records):
                raise ValueError(f"record {name!r} is weighted differently from the announcement")
            for key, dtype, shape in rec["arrays"]:
                if np.dtype(dtype).kind not in "fiub":  # the sum decodes to numbers only
                    raise ValueError(f"array {key!r} has dtype {dtype!r}, not a number type")
                if not isinstance(key, str) or not isinstance(shape, list) or not all(
                        is_int(s) and s >= 0 for s in shape):
                    raise ValueError(f"bad array entry {key!r}")
            if rec["delta"]:
                ref = refs.get(name)
                if ref is None or [k for k, _, _ in rec["arrays"]] != list(ref.keys()) or any(
                        tuple(shape) != tuple(ref[k].numpy().shape) for k, _, shape in rec["arrays"]):
                    raise ValueError(f"record {name!r} is a delta but does not match the model sent")
        return layout

    def _secure_round(self, messages: list[Message], timeout: float | None) -> list[Message]:
        by_node: dict[int, Message] = {}
        for m in messages:
            node = m.metadata.dst_node_id
            if node in by_node:
                raise SecureAggregationError(f"two train messages for node {node} in one round")
            by_node[node] = m
        not_enrolled = [n for n in by_node if n not in self.server.enrolled]
        if not_enrolled:
            self.enroll(nodes=not_enrolled)
        self.round += 1
        t = self.round
        report = self.report = RoundReport(round=t)
        for n in sorted(by_node):
            why = "not enrolled in secure aggregation" if n not in self.server.enrolled else self.excluded.get(n)
            if why:
                report.problems[n] = why
                self.log(f"secure aggregation round {t}: node {n} is left out ({why})")
        selected = tuple(sorted(n for n in by_node if n not in report.problems))
        report.selected = selected
        if len(selected) < self.params.min_survivors:
            report.aborted = f"{len(selected)} usable nodes selected, fewer than {self.params.min_survivors}"
            self.log(f"secure aggregation round {t}: aborted ({report.aborted}); the model stays unchanged")
            return []
        by_node = {n: by_node[n] for n in selected}
        refs = self._references(by_node)
        announcement = self.server.start_round(t, selected)
        directory = self.server.directory()
        common = {"run": u64b(self.protocol_run), "round": u64b(announcement.round),
                  "selected": ids_bytes(announcement.selected), "weight-scale": float(self.weight_scale),
                  "unit-records": ",".join(self.unit_records), "directory-digest": directory_digest(directory)}
        full = {**common, **directory_fields(directory)}
        out = []
        # The instructions expire with the round: the SuperLink then neither hands one to a node nor stores a
        # reply to it, so no vector can wait there past the timeout to be unmasked by the reveals.
        for n, m in by_node.items():
            cfg = ConfigRecord(dict(common if n in self._has_directory else full))
            content = RecordDict({**dict(m.content.items()), RECORD: cfg})
            ttl = m.metadata.ttl if timeout is None else min(m.metadata.ttl, timeout)
            out.append(Message(content, dst_node_id=n, message_type=m.metadata.message_type, ttl=ttl,
                               group_id=m.metadata.group_id))
        replies = self._from_nodes(self.inner.send_and_receive(out, timeout=timeout), out, t)
        report.round_trips = 1
        accepted, errors, layout = self._collect(replies, by_node, refs, report)
        for n in self.server.pending():
            if n not in report.problems:
                report.problems[n] = "no reply before the timeout"
                self._has_directory.discard(n)
                self.log(f"secure aggregation round {t}: node {n} did not reply; dropped")
        if self.server.pending():
            request = self.server.declare_dropped()
            if request is not None:
                self._reveal(request, timeout, report)
        try:
            t0 = time.perf_counter()
            result = self.server.result()
        except RoundAborted as exc:
            report.aborted = str(exc)
            self.log(f"secure aggregation: {exc}; the model stays unchanged")
            return errors
        report.survivors, report.dropped = tuple(result.survivors), tuple(result.dropped)
        try:
            replies_out = self._synthetic_replies(result, layout, refs, accepted)
        except Exception as exc:  # the layout passed every check; still, a failure must not touch the model
            report.aborted = f"decoding failed: {type(exc).__name__}: {_short(str(exc))}"
            self.log(f"secure aggregation round {t}: {report.aborted}; the model stays unchanged")
            return errors
        report.seconds_decode = time.perf_counter() - t0
        return replies_out + errors

    def _collect(self, replies: list[Message], by_node: dict[int, Message], refs: dict[str, ArrayRecord],
                 report: RoundReport) -> tuple[dict[int, Message], list[Message], dict[str, Any] | None]:
        """Sum the round's masked vectors: (accepted replies, error replies, their layout).

        A reply without a vector (a client error, or a client that could not mask) drops its node for the
        round. A reply WITH a vector is either summed or aborts the round (`SecAggServer.refuse`): the
        server holds that vector, so revealing its sender's masks would unmask it. Its sender is also
        excluded from later rounds, so one node cannot abort every round. The layout (and metric names)
        every vector must share is the most common one of the round, not the first to arrive.
        """
        t = report.round
        errors: list[Message] = []  # passed up as they are: an error carries no data (e.g. a budget refusal)
        parsed: dict[int, tuple[MaskedUpdate, dict[str, Any], Message]] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in by_node or node in parsed or node in report.problems:
                self.log(f"secure aggregation round {t}: ignoring an unexpected reply from node {node}")
            elif reply.has_error():
                errors.append(reply)
                self._drop(node, f"client error: {_short(reply.error.reason)}", report)
            elif VECTOR not in reply.content:
                cfg = reply.content.get(RECORD)
                reason = cfg.get("error", "no masked vector") if isinstance(cfg, ConfigRecord) else "no masked vector"
                self._drop(node, f"client could not mask its update: {_short(str(reason))}", report)
            else:
                try:
                    parsed[node] = (*self._parse(reply, node, refs), reply)
                except Exception as exc:  # adversarial content can raise anything from numpy, json, ...
                    self._exclude(node, f"malformed: {type(exc).__name__}: {_short(str(exc))}", report)
        shape = _majority({n: _signature(mu, layout) for n, (mu, layout, _) in parsed.items()})
        if parsed and shape is None:
            self.server.abort("the masked updates disagree on their layout and none is the most common")
        for node, (mu, node_layout, _) in parsed.items():
            if shape is not None and _signature(mu, node_layout) != shape:
                self._exclude(node, "its layout or metric names differ from the round's most common ones", report)
        accepted: dict[int, Message] = {}
        layout = None
        for node, (mu, node_layout, reply) in parsed.items():
            if not self.server.collecting():  # aborted: the rest are neither summed nor at fault
                break
            if node in report.problems:
                continue
            try:
                self.server.receive(mu)
            except Exception as exc:  # a ProtocolError, or anything else: never crash on one reply
                self._exclude(node, f"{type(exc).__name__}: {_short(str(exc))}", report)
                continue
            accepted[node], layout = reply, node_layout
            self._has_directory.add(node)
        return accepted, errors, layout

    def _parse(self, reply: Message, node: int, refs: dict[str, ArrayRecord]) -> tuple[MaskedUpdate, dict[str, Any]]:
        mu = masked_update_from_content(reply.content)
        if mu.node_id != node:
            raise ValueError(f"the masked update names node {mu.node_id}")
        layout = self._check_layout(mu.layout, refs)  # parsed now, authenticated by receive's tag check
        if mu.masked.shape != (layout_size(layout) + 1 + len(mu.metric_keys),):
            raise ValueError("its vector length does not match its layout")
        return mu, layout

    def _drop(self, node: int, problem: str, report: RoundReport) -> None:
        """Node `node` sent no vector this round: it is dropped (its masks may be revealed)."""
        report.problems[node] = problem
        self._has_directory.discard(node)
        self.log(f"secure aggregation round {report.round}: dropping node {node}: {problem}")

    def _exclude(self, node: int, problem: str, report: RoundReport) -> None:
        """Node `node`'s vector arrived but cannot be summed: abort the round and exclude the node."""
        report.problems[node] = f"unusable masked update ({problem})"
        self._has_directory.discard(node)
        self.excluded[node] = f"its masked update in round {report.round} was unusable: {problem}"
        self.server.refuse(node, problem)
        self.log(f"secure aggregation round {report.round}: the masked update of node {node} is unusable "
                 f"({problem}); the round aborts (revealing its masks would unmask it) and the node is left out "
                 "of later rounds")

    def _from_nodes(self, replies: Iterable[Message], sent: list[Message], t: int) -> list[Message]:
        """The nodes' replies. Flower's SuperLink answers for a node whose instruction expired unanswered
        (src = the SuperLink's own id, reply_to = the instruction): logged under that node, which has not
        replied and is dropped as such."""
        node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in sent if m.metadata.message_id}
        kept = []
        for reply in replies:
            node = node_of.get(reply.metadata.reply_to_message_id)
            if reply.metadata.src_node_id != SUPERLINK_NODE_ID or node is None:
                kept.append(reply)
                continue
            why = _short(reply.error.reason) if reply.has_error() else "a reply without content"
            self.log(f"secure aggregation round {t}: the SuperLink answered for node {node}: {why}")
        return kept

    def _reveal(self, request, timeout: float | None, report: RoundReport) -> None:
        t = request.round
        self.log(f"secure aggregation round {t}: {len(request.dropped)} dropped; asking "
                 f"{len(request.survivors)} survivors to reveal their masks with them")
        msgs = [Message(reveal_request_to_content(request), dst_node_id=s, message_type=REVEAL_TYPE)
                for s in request.survivors]
        replies = self._from_nodes(self.inner.send_and_receive(msgs, timeout=timeout), msgs, t)
        report.round_trips += 1
        for reply in replies:
            node = reply.metadata.src_node_id
            try:
                if reply.has_error():
                    raise ValueError(f"client error: {_short(reply.error.reason)}")
                rev = mask_reveal_from_content(reply.content)
                if rev.node_id != node:
                    raise ValueError(f"the reveal names node {rev.node_id}")
                self.server.receive_reveal(rev)
            except Exception as exc:  # a ProtocolError, or anything malformed: never crash on one reply
                self.log(f"secure aggregation round {t}: bad mask reveal from node {node}: {_short(str(exc))}")
        silent = sorted(self.server.pending())
        self.server.declare_reveal_timeout()
        # A survivor that withholds its reveal while others reveal would abort every round that has a
        # dropout; leave it out of later rounds. If nobody revealed, blame the network, not the nodes.
        if silent and len(silent) < len(request.survivors):
            for node in silent:
                report.problems[node] = "no valid mask reveal"
                self._has_directory.discard(node)
                self.excluded[node] = f"it did not reveal its masks with the dropped nodes in round {t}"
                self.log(f"secure aggregation round {t}: node {node} did not reveal while other survivors did; "
                         "it is left out of later rounds")

    def _synthetic_replies(self, result, layout: dict[str, Any], refs: dict[str, ArrayRecord],
                           accepted: dict[int, Message]) -> list[Message]:
        survivors = list(result.survivors)
        total_w = float(result.total_weight)
        count = len(survivors)
        # each w_i <= enrolled n_i / scale (plaintext replies are screened so), each on the codec's grid
        most = sum(self.num_examples.get(s, 0) for s in survivors) / self.weight_scale \
            + count * 2.0 ** -self.params.codec.frac_bits
        if total_w > most:  # only the sum is seen: some survivor weighed itself up (a pull on the mean)
            self.log(f"secure aggregation round {result.round}: total weight {total_w:.6g} is more than the "
                     f"survivors enrolled with ({most:.6g}); the model stays unchanged")
            return []
        values = result.weighted_sum
        records: dict[str, ArrayRecord] = {}
        offset = 0
        for rec in layout["records"]:
            size = sum(array_size(shape) for _, _, shape in rec["arrays"])
            seg = values[offset:offset + size]
            offset += size
            if rec["unit"]:
                mean = seg / count
            else:
                if not total_w > 0:
                    self.log(f"secure aggregation round {result.round}: total weight {total_w} is not positive; "
                             "the model stays unchanged")
                    return []
                mean = seg / total_w
            if rec["delta"]:
                mean = mean + flatten(refs[rec["name"]])
            records[rec["name"]] = unflatten(mean, rec["arrays"])
        metrics: dict[str, float | int] = {}
        if total_w > 0:
            metrics.update({k: float(v) / total_w for k, v in result.metrics.items()})
        metrics.update({"secagg-clients": count, "secagg-dropped": len(result.dropped),
                        "secagg-examples": float(total_w * self.weight_scale)})
        out = []
        for s in survivors:
            content = RecordDict({**records, layout["metric-record"]: MetricRecord({NUM_EXAMPLES: 1, **metrics})})
            out.append(Message(content=content, metadata=copy.copy(accepted[s].metadata)))
        return out


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _signature(mu: MaskedUpdate, layout: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    return json.dumps(layout, sort_keys=True), tuple(mu.metric_keys)


def _majority(signatures: dict[int, Any]) -> Any:
    """The most common value, or None if there is none or it is tied (nobody can tell who is wrong)."""
    ranked = Counter(signatures.values()).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]
