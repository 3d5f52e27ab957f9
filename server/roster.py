"""Who is in the federation: wait for the expected nodes, then enroll them.

Enrollment is one `query.enroll` round trip: each node reports its partition
id and training-set size (in a resumable private run also its ledger's last
round: server/lost_round.py). The server then addresses clients by partition, so
client sampling is the same whatever node ids the runtime hands out
(simulation, deployment and the in-process engine all agree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from client.privacy import SERVER_STARTED
from common.number_checks import is_int
from common.records import CONFIG
from server.lost_round import LedgerTail, parse_tail


class FederationError(RuntimeError):
    """The federation does not have the nodes the run needs."""


@dataclass(frozen=True)
class Roster:
    node_of: dict[int, int]  # partition id -> node id
    num_examples: dict[int, int]  # partition id -> training examples
    # partition id -> what its ledger holds of its last round (resumable private runs; server/lost_round.py)
    ledger_tails: dict[int, LedgerTail] = field(default_factory=dict)
    enrolled_at: int = 0  # this start's SERVER_STARTED (ns): the fence it leaves on the nodes' ledgers

    @property
    def partitions(self) -> list[int]:
        return sorted(self.node_of)


def wait_for_nodes(grid: Grid, expected: int, timeout: float, log=print) -> list[int]:
    """Block until `expected` nodes are connected; never start with fewer."""
    deadline, last = time.monotonic() + timeout, -1
    while True:
        nodes = list(grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        if len(nodes) != last:
            log(f"waiting for nodes: {len(nodes)} of {expected} connected")
            last = len(nodes)
        if time.monotonic() > deadline:
            raise FederationError(
                f"only {len(nodes)} of num-clients = {expected} nodes connected within {timeout:.0f} s; "
                f"start more SuperNodes, or in simulation pass --federation-config 'num-supernodes={expected}'"
            )
        time.sleep(0.2)


def _field(info, name: str, node: int) -> int:
    """One int field of a node's enrollment reply. The ClientApp sends ints: anything else
    (a float, a bool, a string, nothing) is a misconfigured or hostile node."""
    if name not in info:
        raise FederationError(f"node {node}: enrollment reply lacks {name!r}; is it running privfed's ClientApp?")
    value = info[name]
    if not is_int(value):
        raise FederationError(f"node {node}: enrollment field {name!r} must be an int, got {value!r}")
    return value


def _entry(reply: Message, expected: int, sizes: Sequence[int] | None) -> tuple[int, int]:
    """(partition id, num-examples) of one enrollment reply, checked; FederationError naming the node."""
    node = reply.metadata.src_node_id
    info = reply.content.get(CONFIG)
    if not isinstance(info, ConfigRecord):
        raise FederationError(f"node {node}: enrollment reply has no {CONFIG!r} record; "
                              "is it running privfed's ClientApp?")
    partition, size = _field(info, "partition-id", node), _field(info, "num-examples", node)
    if not 0 <= partition < expected:
        raise FederationError(f"node {node}: partition-id {partition} is outside 0..{expected - 1} "
                              f"(num-clients = {expected}); fix its --node-config")
    if size <= 0:
        raise FederationError(f"node {node}: num-examples {size} must be positive (partition {partition})")
    # an overstated size would give the node's replies more weight than its data earns
    if sizes is not None and partition < len(sizes) and size > sizes[partition]:
        raise FederationError(f"node {node}: num-examples {size} exceeds partition {partition}'s "
                              f"{sizes[partition]} training examples; check that the node loads the same dataset")
    return partition, size


def enroll(grid: Grid, expected: int, timeout: float, log=print, sizes: Sequence[int] | None = None) -> Roster:
    """Enroll partitions 0..expected-1, one node each; `sizes`: each partition's true training-set size
    where the server knows it (num-examples may not exceed it).

    Every connected node must enroll cleanly: an error reply, a malformed or out-of-range entry (bad
    partition-id or num-examples), or two nodes on one partition stop the run with a FederationError
    naming the nodes, as does a partition no node holds. No node is silently left out: the aggregation
    weights and the privacy accounting depend on the roster."""
    nodes = wait_for_nodes(grid, expected, timeout, log)
    # the time orders this start's enrollment after earlier starts' (a node's fence, client/privacy.py)
    started = time.time_ns()
    ask = ConfigRecord({SERVER_STARTED: started})
    asks = [Message(RecordDict({CONFIG: ask}), dst_node_id=n, message_type="query.enroll") for n in nodes]
    node_of, sizes_of, tails, problems = {}, {}, {}, []
    for reply in grid.send_and_receive(asks, timeout=timeout):
        src = reply.metadata.src_node_id
        if reply.has_error():
            # Flower's SuperLink answers for an unavailable node itself (src = its own id): name the node asked
            src = next((m.metadata.dst_node_id for m in asks if m.metadata.message_id
                        and m.metadata.message_id == reply.metadata.reply_to_message_id), src)
            problems.append(f"node {src}: {reply.error.reason}")
            continue
        try:
            partition, size = _entry(reply, expected, sizes)
        except FederationError as bad:
            problems.append(str(bad))
            continue
        if partition in node_of:
            problems.append(f"nodes {node_of[partition]} and {src} both hold partition {partition}")
            continue
        node_of[partition], sizes_of[partition] = src, size
        if (tail := parse_tail(reply.content[CONFIG])) is not None:
            tails[partition] = tail
    missing = sorted(set(range(expected)) - set(node_of))
    if missing:
        problems.append(f"partitions {missing} not enrolled" + ("" if problems else " (no reply)"))
    if problems:
        raise FederationError("enrollment failed: " + "; ".join(problems))
    return Roster(node_of, sizes_of, tails, started)
