"""Screening client replies before aggregation.

A malformed or adversarial reply (error, wrong keys or shapes, NaN/inf,
non-positive or inflated example count) is dropped with a log line naming the
node and the reason; it never reaches the aggregate and never crashes the
server.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from common.number_checks import is_real
from common.records import ARRAYS, MAX_ABS_VALUE, METRICS, NUM_EXAMPLES, magnitude_problem  # noqa: F401 (re-exported)




def reply_problem(msg: Message, reference: ArrayRecord, max_examples: int | None) -> str | None:
    """Why `msg` cannot be aggregated against `reference`, or None if it can."""
    if msg.has_error():
        return f"{CLIENT_ERROR}{msg.error.reason}"
    content = msg.content
    if sorted(content.keys()) != sorted((ARRAYS, METRICS)) or not isinstance(content[ARRAYS], ArrayRecord) \
            or not isinstance(content[METRICS], MetricRecord):  # Flower raises on replies with other names
        return f"expected an ArrayRecord {ARRAYS!r} and a MetricRecord {METRICS!r}, got {sorted(content.keys())}"
    return arrays_problem(content[ARRAYS], reference) or examples_problem(content[METRICS], max_examples)


def arrays_problem(got: ArrayRecord, reference: Mapping[str, Any], what: str = "array") -> str | None:
    """Why `got` does not match `reference` (an ArrayRecord or a dict of numpy arrays): names, and per
    array its dtype, shape and finite values. A dtype other than the reference's (strings, complex, ...)
    would crash or silently change the aggregate, so it is refused like a wrong shape."""
    if list(got.keys()) != list(reference.keys()):
        return f"{what} names differ from the expected {list(reference.keys())}"
    for key, ref in reference.items():
        values = read_payload(got[key])
        if isinstance(values, str):
            return f"{what} {key!r} {values}"
        want_dtype, want_shape = np.dtype(ref.dtype), tuple(ref.shape)
        if values.dtype != want_dtype or values.shape != want_shape:
            return (f"{what} {key!r} is {values.dtype} of shape {values.shape}, "
                    f"expected {want_dtype} of shape {want_shape}")
        problem = magnitude_problem(values)
        if problem:
            return f"{what} {key!r} {problem}"
    return None


def read_payload(array) -> np.ndarray | str:
    """The array a reply's Array holds, or why it holds none (a client controls these bytes)."""
    try:
        values = array.numpy()
    except (TypeError, ValueError, OSError, EOFError) as exc:  # not a readable .npy payload
        return f"cannot be read: {exc}"
    if not isinstance(values, np.ndarray):  # np.load turns zip bytes into an NpzFile
        return "is not an array payload"
    return values


def examples_problem(metric: MetricRecord, max_examples: int | None) -> str | None:
    """Why the reply's example count (its aggregation weight) cannot be used, or None."""
    n = metric.get(NUM_EXAMPLES)
    if not is_real(n) or not np.isfinite(n) or n <= 0:
        return f"{NUM_EXAMPLES!r} must be a positive number, got {n!r}"
    if max_examples is not None and n > max_examples:
        return f"{NUM_EXAMPLES!r} = {n} exceeds the {max_examples} examples the node enrolled with"
    return None


DROPPING = "dropping reply"  # how every strategy's log line about a screened-out reply begins
CLIENT_ERROR = "client error: "  # its problem for an error reply (the runner counts those as failed already)


def screened_out(log_line: str) -> bool:
    """Whether a strategy's log line says it dropped a reply that was not an error reply."""
    return log_line.startswith(DROPPING) and f": {CLIENT_ERROR}" not in log_line


def screen(replies: Iterable[Message], reference: ArrayRecord, max_examples: Callable[[int], int | None],
           log: Callable[[str], None]) -> list[Message]:
    good = []
    for msg in replies:
        problem = reply_problem(msg, reference, max_examples(msg.metadata.src_node_id))
        if problem:
            log(f"{DROPPING} from node {msg.metadata.src_node_id}: {problem}")
        else:
            good.append(msg)
    harmonise_metrics(good, log)
    return good


def harmonise_metrics(replies: list[Message], log: Callable[[str], None]) -> None:
    """Keep in each reply's MetricRecord only the number-valued metrics that every reply reports.

    Flower raises when the replies' metric keys differ and cannot average a list against a number, so
    one client's extra, missing or list-valued metric would crash the round; the model update itself is
    fine and stays. Records are edited in place, so views of a reply (SCAFFOLD's) see the same metrics.
    """
    records = [next(r for r in m.content.values() if isinstance(r, MetricRecord)) for m in replies]
    numbers = [{k for k, v in r.items() if not isinstance(v, list)} for r in records]
    common = set.intersection(*numbers) if numbers else set()
    dropped = sorted(set().union(*records) - common) if records else []
    if not dropped:
        return
    lacking = {m.metadata.src_node_id: sorted(set(dropped) - n) for m, n in zip(replies, numbers) if set(dropped) - n}
    log(f"metrics {dropped} left out of this round's aggregate (each must be a number in every reply); "
        f"missing or not a number in the replies of nodes {lacking}")
    for record in records:
        for key in dropped:
            record.pop(key, None)
