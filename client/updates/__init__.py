"""Local update rules, one module each, looked up by the run's `strategy`.

A rule takes the node's `LocalClient`, the instruction's content and the
node's persistent `Context.state`, and returns the reply content.
"""

from __future__ import annotations

from typing import Callable

from flwr.app import RecordDict

UpdateRule = Callable[["LocalClient", RecordDict, RecordDict], RecordDict]  # noqa: F821


def update_rule(strategy: str) -> UpdateRule:
    if strategy == "fedavg":
        from client.updates.sgd import sgd_update

        return sgd_update
    raise ValueError(f"no local update rule for strategy {strategy!r}")
