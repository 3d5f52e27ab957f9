"""A grid wrapper that counts payload bytes sent to and received from clients."""

from __future__ import annotations

from typing import Iterable

from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid

from common.records import recorddict_nbytes
from server.delegating_grid import DelegatingGrid


def reply_nbytes(reply: Message) -> int:
    """A reply's payload bytes. Its arrays' dtypes are the client's word, read here before screening: where
    numpy does not know one, count the array bytes that came (screening drops the reply)."""
    try:
        return recorddict_nbytes(reply.content)
    except (TypeError, ValueError):
        return sum(len(a.data) for r in reply.content.values() if isinstance(r, ArrayRecord) for a in r.values())


class MeteredGrid(DelegatingGrid):
    """Delegates to `inner`; `bytes_down` / `bytes_up` count message payloads."""

    def __init__(self, inner: Grid):
        super().__init__(inner)
        self.bytes_down = self.bytes_up = self.messages_down = 0

    def reset(self) -> None:
        self.bytes_down = self.bytes_up = self.messages_down = 0

    def _count_down(self, messages: list[Message]) -> None:
        self.messages_down += len(messages)
        self.bytes_down += sum(recorddict_nbytes(m.content) for m in messages if m.has_content())

    def _count_up(self, replies: list[Message]) -> None:
        self.bytes_up += sum(reply_nbytes(m) for m in replies if m.has_content())

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self._count_down(messages)
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self.inner.pull_messages(message_ids))
        self._count_up(replies)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if not messages:
            return []
        self._count_down(messages)
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        self._count_up(replies)
        return replies
