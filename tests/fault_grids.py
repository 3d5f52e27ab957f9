"""Grids that fail on purpose, shared by the checkpoint, determinism and extension tests."""


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
