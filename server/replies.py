"""Screening client replies before aggregation.

A malformed or adversarial reply (error, wrong keys or shapes, NaN/inf,
non-positive or inflated example count) is dropped with a log line naming the
node and the reason; it never reaches the aggregate and never crashes the
server.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from common.records import NUM_EXAMPLES


def reply_problem(msg: Message, reference: ArrayRecord, max_examples: int | None) -> str | None:
    """Why `msg` cannot be aggregated against `reference`, or None if it can."""
    if msg.has_error():
        return f"client error: {msg.error.reason}"
    content = msg.content
    arrays = [r for r in content.values() if isinstance(r, ArrayRecord)]
    metrics = [r for r in content.values() if isinstance(r, MetricRecord)]
    if len(arrays) != 1 or len(metrics) != 1:
        return f"expected one ArrayRecord and one MetricRecord, got {len(arrays)} and {len(metrics)}"
    got, metric = arrays[0], metrics[0]
    if list(got.keys()) != list(reference.keys()):
        return "array names differ from the global model's"
    for key, ref in reference.items():
        a = got[key]
        if tuple(a.shape) != tuple(ref.shape):
            return f"array {key!r} has shape {tuple(a.shape)}, expected {tuple(ref.shape)}"
        values = a.numpy()
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return f"array {key!r} holds NaN or inf"
    n = metric.get(NUM_EXAMPLES)
    if not isinstance(n, (int, float)) or isinstance(n, bool) or not np.isfinite(n) or n <= 0:
        return f"{NUM_EXAMPLES!r} must be a positive number, got {n!r}"
    if max_examples is not None and n > max_examples:
        return f"{NUM_EXAMPLES!r} = {n} exceeds the {max_examples} examples the node enrolled with"
    return None


def screen(replies: Iterable[Message], reference: ArrayRecord, max_examples: Callable[[int], int | None],
           log: Callable[[str], None]) -> list[Message]:
    good = []
    for msg in replies:
        problem = reply_problem(msg, reference, max_examples(msg.metadata.src_node_id))
        if problem:
            log(f"dropping reply from node {msg.metadata.src_node_id}: {problem}")
        else:
            good.append(msg)
    return good
