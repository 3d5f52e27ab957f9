"""A grid wrapper that collects replies with a short poll.

Flower's deployment grid (`HttpGrid.send_and_receive`) sleeps a hard-coded
3 s between pulls for replies, so a round ends on a 3 s tick; the simulation
grid ticks every 0.1 s. `PollingGrid` implements `send_and_receive` itself
from the grid's public `push_messages` / `pull_messages`, pulling the
outstanding replies every `poll_interval` seconds until all are in or the
timeout has passed (the same contract as Flower's: `timeout=None` waits for
ever). Everything else is delegated to the wrapped grid.

Measured with `benchmarks/deployment_round.py` (see deploy/README.md).
"""

from __future__ import annotations

import time
from typing import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from server.delegating_grid import DelegatingGrid


class PollingGrid(DelegatingGrid):
    """Delegates to `inner`; `send_and_receive` polls every `poll_interval` seconds."""

    def __init__(self, inner: Grid, poll_interval: float = 0.1):
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        super().__init__(inner)
        self.poll_interval = float(poll_interval)
        self.pulls = 0  # number of pull_messages calls (for tests and benchmarks)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if not messages:
            return []
        outstanding = {mid for mid in self.push_messages(messages) if mid}
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while outstanding:
            got = list(self.pull_messages(outstanding))
            replies.extend(got)
            outstanding.difference_update(m.metadata.reply_to_message_id for m in got)
            if not outstanding:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            time.sleep(self.poll_interval if deadline is None else min(self.poll_interval, deadline - now))
        return replies

    def __getattr__(self, name: str):  # anything else the wrapped grid offers (get_nodes, close, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def with_polling(grid: Grid, poll_interval: float) -> Grid:
    """`grid` wrapped in a `PollingGrid` if it is one of Flower's grids and the
    interval is > 0; privfed's own grids (in-process) are returned as they are."""
    if poll_interval <= 0 or not type(grid).__module__.startswith("flwr."):
        return grid
    return PollingGrid(grid, poll_interval)
