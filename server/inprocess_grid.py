"""A Flower `Grid` that delivers each message straight to a `ClientApp` in this
process: no SuperLink, no pollers, no sleeps.

Each node has its own `Context` (node id, `node_config` with `partition-id` /
`num-partitions`, a `state` that persists across messages, the run config),
as Flower's simulation engine gives it. Replies carry the metadata Flower's
runtime would set (message id, src/dst node ids, reply-to id), and a ClientApp
exception becomes an error reply, never an exception in the server. A
ClientApp result that is not a reply to its message (None, a reply to another
message, from another node) is dropped, as Flower's SuperLink refuses to store
it: the server sees no reply.

`workers = 1` runs clients one after another in this process. `workers = N`
runs them in N worker processes (spawned; each with this process's torch
thread count, which `run_inprocess` sets: a float sum depends on how many
threads split it); each node is pinned to one worker so its `Context.state`
lives on between messages. Results do not depend on `workers`.

Timeouts (`send_and_receive(..., timeout=T)`): replies that are not ready
within T seconds are dropped, as in Flower. With `workers = 1` a running
client cannot be interrupted: once the deadline has passed, the reply of the
client that was running is dropped and the remaining messages are not
delivered at all. With workers, the late clients finish in the background and
their replies are discarded; `close()` stops a client still running instead of
waiting for it. A worker that dies takes its nodes with it: their messages get
NODE_UNAVAILABLE error replies, as from a SuperNode that dropped out.
"""

from __future__ import annotations

import importlib
import multiprocessing
import secrets
import signal
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Iterable
from uuid import uuid4

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


def load_client_app(spec: str):
    """'module:attribute' -> the ClientApp object."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr or "app")


def node_ids_for(run_id: int, num_nodes: int) -> list[int]:
    """Distinct, non-contiguous 63-bit ids (as Flower's), fixed by the run id."""
    rng = np.random.default_rng([run_id, 0x6E6F6465])
    ids: list[int] = []
    while len(ids) < num_nodes:
        candidate = int(rng.integers(2, 2**63 - 1))
        if candidate not in ids and candidate != SUPERLINK_NODE_ID:
            ids.append(candidate)
    return ids


def deliver(client_app, message: Message, context: Context) -> Message | None:
    """Run the ClientApp on one message, as Flower's runtime does; None if its result is no valid reply."""
    try:
        reply = client_app(message, context)
    except Exception as ex:  # a client failure is a reply, not a server crash
        return error_reply(message, ex, ErrorCode.CLIENT_APP_RAISED_EXCEPTION)
    if not is_reply_to(reply, message):  # Flower's SuperLink would not store it either
        return None
    reply.metadata.__dict__["_message_id"] = str(uuid4())
    return reply


def is_reply_to(reply, message: Message) -> bool:
    """`reply` answers `message`, from the node it was sent to (what Flower's SuperLink checks)."""
    if not isinstance(reply, Message):
        return False
    got, sent = reply.metadata, message.metadata
    return (got.reply_to_message_id == sent.message_id and got.src_node_id == sent.dst_node_id
            and got.dst_node_id == SUPERLINK_NODE_ID and got.run_id == sent.run_id)


def error_reply(message: Message, ex: BaseException, code: int) -> Message:
    """An error reply to `message`, with the exception and a short traceback as the reason."""
    tb = "".join(traceback.format_exception(ex, limit=8))
    reply = Message(Error(code=code, reason=f"{type(ex)}:<'{ex}'>\n{tb}"), reply_to=message)
    reply.metadata.__dict__["_message_id"] = str(uuid4())
    return reply


# --- worker processes ---------------------------------------------------------
_worker_app = None
_worker_contexts: dict[int, Context] = {}


def _worker_init(app_spec: str, contexts: dict[int, Context], threads: int) -> None:
    import torch

    global _worker_app
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops workers
    torch.set_num_threads(threads)
    _worker_app = load_client_app(app_spec)
    _worker_contexts.update(contexts)


def _worker_deliver(message: Message) -> Message:
    return deliver(_worker_app, message, _worker_contexts[message.metadata.dst_node_id])


class InProcessGrid(Grid):
    def __init__(self, client_app_spec: str, run_config: dict, num_nodes: int, *, run_id: int | None = None,
                 workers: int = 1):
        # A fresh run id per run, as Flower's: node state (privacy ledgers) is keyed by it.
        run_id = secrets.randbits(63) if run_id is None else run_id
        self.run_id, self.workers = run_id, workers
        self.node_ids = node_ids_for(run_id, num_nodes)
        self.contexts = {
            node: Context(run_id=run_id, node_id=node,
                          node_config={"partition-id": i, "num-partitions": num_nodes},
                          state=RecordDict(), run_config=dict(run_config))
            for i, node in enumerate(self.node_ids)
        }
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._replies: dict[str, Message | Future] = {}
        self._sent: dict[str, Message] = {}  # messages out to workers, for error replies
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SUPERLINK_NODE_ID, run_id
        self._pools: list[ProcessPoolExecutor] = []
        if workers > 1:
            self._start_workers(client_app_spec)
        else:
            self.client_app = load_client_app(client_app_spec)

    def _start_workers(self, spec: str) -> None:
        ctx = multiprocessing.get_context("spawn")  # torch and fork do not mix
        import torch

        threads = torch.get_num_threads()  # as in this process: the same numbers as workers = 1
        self._pool_of: dict[int, ProcessPoolExecutor] = {}
        self._last_task: dict[ProcessPoolExecutor, Future] = {}  # one worker each, FIFO: busy while not done
        for w in range(self.workers):
            mine = {n: c for i, (n, c) in enumerate(self.contexts.items()) if i % self.workers == w}
            pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_worker_init, initargs=(spec, mine, threads))
            self._pools.append(pool)
            self._pool_of.update({n: pool for n in mine})

    def close(self) -> None:
        for pool in self._pools:
            last = self._last_task.get(pool)
            if last is not None and not last.done():  # a client past its round's deadline: stop, not wait
                for proc in (pool._processes or {}).values():  # private, but the only handle on the worker
                    proc.kill()
            pool.shutdown(cancel_futures=True)
        self._pools.clear()

    def __enter__(self) -> "InProcessGrid":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Grid interface -------------------------------------------------------
    def set_run(self, run_id: int) -> None:
        self.run_id = run_id

    @property
    def run(self):
        return self.run_id

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if node not in self.contexts:
                raise ValueError(f"message addressed to unknown node {node}")
            msg_id = str(uuid4())
            msg.metadata.__dict__["_message_id"] = msg_id
            msg.metadata.__dict__["_run_id"] = self.run_id
            msg.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            if self._pools:
                self._sent[msg_id] = msg
                try:
                    pool = self._pool_of[node]
                    self._replies[msg_id] = self._last_task[pool] = pool.submit(_worker_deliver, msg)
                except BrokenProcessPool as ex:  # its worker died: the node is gone
                    self._replies[msg_id] = error_reply(msg, ex, ErrorCode.NODE_UNAVAILABLE)
            else:
                self._replies[msg_id] = deliver(self.client_app, msg, self.contexts[node])
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = []
        for msg_id in message_ids:
            if msg_id not in self._replies:
                continue
            reply = self._replies[msg_id]
            if isinstance(reply, Future):
                if not reply.done():
                    continue
                try:
                    reply = reply.result()
                except Exception as ex:  # the worker process died or could not run the message
                    reply = error_reply(self._sent[msg_id], ex, ErrorCode.UNKNOWN)
            del self._replies[msg_id]
            self._sent.pop(msg_id, None)
            if reply is not None:  # None: no valid reply was made (see `deliver`)
                out.append(reply)
        return out

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pools:
            ids = list(self.push_messages(messages))
            pending = [self._replies[i] for i in ids if isinstance(self._replies[i], Future)]
            if pending:
                wait(pending, timeout=timeout)
            replies = list(self.pull_messages(ids))
            for msg_id in ids:  # replies that missed the timeout are dropped, as in Flower
                self._replies.pop(msg_id, None)
                self._sent.pop(msg_id, None)
            return replies
        replies = []
        for msg in messages:  # one after another; stop at the deadline
            if deadline is not None and time.monotonic() > deadline:
                break
            (msg_id,) = self.push_messages([msg])
            reply = self._replies.pop(msg_id)
            if reply is not None and (deadline is None or time.monotonic() <= deadline):
                replies.append(reply)
        return replies
