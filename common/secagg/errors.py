"""Exception types of the secure-aggregation package.

Every error raised on purpose by `common.secagg` derives from `SecAggError`.
Errors about a *message* the server (or a client) received derive from
`ProtocolError`; the caller (the secure-aggregation grid) can catch that one
class, log the reason and drop the message, and the round goes on as if the
message had never arrived.

    SecAggError
    +-- ProtocolError            a received message is rejected
    |   +-- WrongRunError        run id is not this run's
    |   +-- ReplayError          round is not the current round (replay or
    |   |                        message from the future)
    |   +-- DuplicateError       second message from the same sender this round
    |   +-- UnexpectedSenderError sender not selected / not a survivor / unknown
    |   +-- LateReplyError       sender was already declared dropped
    |   +-- RoundClosedError     the round is finished or aborted
    |   +-- ContextMismatchError sender masked against another node set,
    |   |                        directory or parameter set
    |   +-- MalformedMessageError wrong type, dtype, shape or length
    |   +-- AuthenticationError  tag does not verify (tampered header/vector)
    +-- RefusedError             a client refuses a request (e.g. an unsafe
    |                            reveal request)
    +-- RoundAborted             the round cannot be decoded; model unchanged
    +-- RoundNotReady            result() called while replies are awaited
    +-- NotEnrolledError         a client has no directory / a node is unknown

`CodecRangeError` (in `codec.py`) is a `ValueError`, not a `SecAggError`: it
is a property of the client's own data, raised before anything is sent.
"""

from __future__ import annotations


class SecAggError(Exception):
    """Base class of every deliberate error of `common.secagg`."""


class ProtocolError(SecAggError):
    """A received message is rejected; the state machine is unchanged."""


class WrongRunError(ProtocolError):
    """The message belongs to another run."""


class ReplayError(ProtocolError):
    """The message names a round other than the current one."""


class DuplicateError(ProtocolError):
    """The sender already delivered this kind of message in this round."""


class UnexpectedSenderError(ProtocolError):
    """The sender is not expected to send this message in this round."""


class LateReplyError(ProtocolError):
    """The sender was declared dropped before its reply arrived."""


class RoundClosedError(ProtocolError):
    """The round is already decoded or aborted."""


class ContextMismatchError(ProtocolError):
    """The message was masked for another (params, run, round, node set, keys)."""


class MalformedMessageError(ProtocolError):
    """The message has the wrong type, dtype, shape or length."""


class AuthenticationError(ProtocolError):
    """The message's tag does not verify: it was altered or relabelled."""


class RefusedError(SecAggError):
    """A client refuses a request that would be unsafe or inconsistent."""


class RoundAborted(SecAggError):
    """The round cannot be decoded (too few survivors, missing reveal, ...).

    The aggregate is undefined; the caller must leave the model unchanged.
    """


class RoundNotReady(SecAggError):
    """`result()` was called while replies or reveals are still awaited."""


class NotEnrolledError(SecAggError):
    """A client has no directory yet, or a node id is not enrolled."""
