"""Base for grid wrappers (grids compose: strategy -> wrappers -> Flower's grid).

Everything is passed to `inner`; a wrapper overrides only what it changes."""

from __future__ import annotations

from typing import Iterable

from flwr.app import Message
from flwr.serverapp import Grid


class DelegatingGrid(Grid):
    def __init__(self, inner: Grid):
        self.inner = inner

    def set_run(self, run_id: int) -> None:
        self.inner.set_run(run_id)

    @property
    def run(self):
        return self.inner.run

    def create_message(self, *args, **kwargs) -> Message:  # deprecated in Flower; kept for the interface
        return self.inner.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.inner.send_and_receive(messages, timeout=timeout)
