"""server/polling_grid.py: short-poll send_and_receive over push/pull (no Flower runtime needed)."""

import time
from types import SimpleNamespace

from server.polling_grid import PollingGrid, with_polling


class FakeGrid:
    """Replies to message i become available `delays[i]` seconds after the push."""

    def __init__(self, delays):
        self.delays, self.pushed, self.t0 = delays, [], None

    def push_messages(self, messages):
        self.t0 = time.monotonic()
        self.pushed = list(messages)
        return [f"id{i}" for i in range(len(self.pushed))]

    def pull_messages(self, ids):
        now, out = time.monotonic() - self.t0, []
        for i, msg in enumerate(self.pushed):
            if f"id{i}" in ids and self.delays[i] is not None and now >= self.delays[i]:
                out.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=f"id{i}")))
        return out

    def get_node_ids(self):
        return [1, 2, 3]


def _msgs(n):  # the wrapper only hands messages to push_messages; replies need only reply_to_message_id
    return [SimpleNamespace(dst_node_id=i + 1) for i in range(n)]


def test_returns_as_soon_as_all_replies_are_in():
    grid = PollingGrid(FakeGrid([0.0, 0.05, 0.12]), poll_interval=0.02)
    t = time.monotonic()
    replies = list(grid.send_and_receive(_msgs(3), timeout=10))
    assert len(replies) == 3 and time.monotonic() - t < 1.0
    assert list(grid.get_node_ids()) == [1, 2, 3]  # delegated


def test_timeout_returns_partial_replies_without_hanging():
    grid = PollingGrid(FakeGrid([0.0, None]), poll_interval=0.05)
    t = time.monotonic()
    replies = list(grid.send_and_receive(_msgs(2), timeout=0.3))
    assert len(replies) == 1 and 0.25 < time.monotonic() - t < 1.0


def test_only_flower_grids_are_wrapped():
    fake = FakeGrid([])
    assert with_polling(fake, 0.1) is fake  # not one of Flower's grids (e.g. the in-process grid)
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    flower = InMemoryGrid.__new__(InMemoryGrid)  # no state needed to check the wrapping decision
    assert isinstance(with_polling(flower, 0.1), PollingGrid)
    assert with_polling(flower, 0.0) is flower  # poll-interval = 0: Flower's own send_and_receive
