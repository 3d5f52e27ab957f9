"""Who is in the federation: wait for the expected nodes, then enroll them.

Enrollment is one `query.enroll` round trip: each node reports its partition
id and training-set size. The server then addresses clients by partition, so
client sampling is the same whatever node ids the runtime hands out
(simulation, deployment and the in-process engine all agree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from common.records import CONFIG


class FederationError(RuntimeError):
    """The federation does not have the nodes the run needs."""


@dataclass(frozen=True)
class Roster:
    node_of: dict[int, int]  # partition id -> node id
    num_examples: dict[int, int]  # partition id -> training examples

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


def enroll(grid: Grid, expected: int, timeout: float, log=print) -> Roster:
    nodes = wait_for_nodes(grid, expected, timeout, log)
    asks = [Message(RecordDict(), dst_node_id=n, message_type="query.enroll") for n in nodes]
    node_of, sizes, problems = {}, {}, []
    for reply in grid.send_and_receive(asks, timeout=timeout):
        src = reply.metadata.src_node_id
        if reply.has_error():
            problems.append(f"node {src}: {reply.error.reason}")
            continue
        info = reply.content[CONFIG]
        partition = int(info["partition-id"])
        if partition in node_of:
            problems.append(f"nodes {node_of[partition]} and {src} both hold partition {partition}")
            continue
        node_of[partition], sizes[partition] = src, int(info["num-examples"])
    missing = sorted(set(range(expected)) - set(node_of))
    if missing or problems:
        detail = "; ".join(problems) or "no reply"
        raise FederationError(f"enrollment failed: partitions {missing} not enrolled ({detail})")
    return Roster(node_of, sizes)
