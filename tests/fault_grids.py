"""Grids that fail on purpose, shared by the checkpoint, determinism, extension and secure-aggregation tests."""

from typing import Iterable

import numpy as np
from flwr.app import Message, MessageType
from flwr.serverapp import Grid

from client.secagg import VECTOR, WORDS, words_record
from server.delegating_grid import DelegatingGrid


class Killed(RuntimeError):
    pass


class DiesAfter:
    """Delegates to the in-process grid; the server "dies" when it sends training round `after + 1`
    (`after_replies`: once the replies of training round `after` are in, before it is checkpointed)."""

    def __init__(self, inner, after: int, after_replies: bool = False):
        self.inner, self.left, self.after_replies = inner, after, after_replies

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            if self.left == 0 and not self.after_replies:
                raise Killed("ServerApp killed")
            self.left -= 1
            if self.left == 0 and self.after_replies:  # the clients trained; the round is not checkpointed
                self.inner.send_and_receive(messages, timeout=timeout)
                raise Killed("ServerApp killed")
        return self.inner.send_and_receive(messages, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Recorder(DelegatingGrid):
    """Below the secure grid: records every message the server receives; can drop or corrupt replies."""

    def __init__(self, inner: Grid, drop: dict[int, int] | None = None, corrupt: dict[int, int] | None = None):
        super().__init__(inner)
        self.received, self.sent, self.train_round = [], [], 0
        self.drop, self.corrupt = drop or {}, corrupt or {}  # train round -> partition index

    def send_and_receive(self, messages: Iterable[Message], *, timeout=None):
        messages = list(messages)
        self.sent.extend(messages)
        is_train = messages and messages[0].metadata.message_type == MessageType.TRAIN
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        self.received.extend(replies)
        if not is_train:
            return replies
        self.train_round += 1
        nodes = list(self.inner.get_node_ids())
        out = []
        for r in replies:
            node = r.metadata.src_node_id
            if self.drop.get(self.train_round) is not None and node == nodes[self.drop[self.train_round]]:
                continue  # lost: as if it missed the timeout
            if self.corrupt.get(self.train_round) is not None and node == nodes[self.corrupt[self.train_round]]:
                words = r.content[VECTOR][WORDS].numpy().copy()
                words[:10] ^= np.uint32(0x5A5A5A5A)
                r.content[VECTOR] = words_record(words)
            out.append(r)
        return out
