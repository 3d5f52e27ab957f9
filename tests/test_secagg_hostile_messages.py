"""Secure aggregation under malformed or hostile messages (common/secagg): every rejected message is a
ProtocolError, and a reveal always removes the masks the round was made with (an adversarial review,
session 21: each test failed on the code it reviewed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.secagg import (
    CodecParams,
    Directory,
    EnrollRequest,
    KeyPair,
    MalformedMessageError,
    Phase,
    ProtocolError,
    SecAggClient,
    SecAggParams,
)
from tests.test_secagg_protocol import enrolled

RUN = 77
PARAMS = SecAggParams(CodecParams(), min_survivors=2)


def federation():
    return enrolled((1, 2, 3, 4), PARAMS, RUN)


def test_invalid_server_public_key_in_directory_is_a_protocol_error():
    """protocol.py on_directory: an all-zero (low-order) X25519 server key escapes as a bare ValueError
    from `cryptography`, while the same key for a peer is a MalformedMessageError. The module contract is
    that every rejected message raises a ProtocolError subclass."""
    _, clients, directory = federation()
    bad = Directory(RUN, b"\0" * 32, dict(directory.public_keys))
    with pytest.raises(MalformedMessageError):
        clients[1].on_directory(bad)


def _round_with_a_dropout():
    server, clients, directory = federation()
    ann = server.start_round(1, sorted(clients))
    msgs = {i: clients[i].masked_update(1, ann.selected, np.full(3, float(i)), 1.0) for i in (1, 2, 3)}
    for m in msgs.values():
        server.receive(m)
    request = server.declare_dropped()
    assert request is not None and request.dropped == (4,)
    return server, clients, directory, request


def test_a_reveal_for_a_peer_a_later_directory_forgot_removes_the_rounds_masks():
    """protocol.py reveal_masks: after a directory that no longer lists node 4 (client/secagg.py applies and
    saves a directory before it checks the round), a reveal request for the round masked with node 4
    crashed with KeyError(4) inside pairwise_mask_sum. The round's own keys rebuild its masks."""
    server, clients, directory, request = _round_with_a_dropout()
    clients[1].on_directory(Directory(RUN, directory.server_public_key,
                                      {k: v for k, v in directory.public_keys.items() if k != 4}))
    for i in request.survivors:
        server.receive_reveal(clients[i].reveal_masks(request))
    np.testing.assert_allclose(server.result().weighted_sum, np.full(3, 6.0), atol=1e-6)


def test_the_rounds_keys_survive_a_client_restart():
    """A client rebuilt from its state_dict after a re-keying directory still reveals the round's masks."""
    server, clients, directory, request = _round_with_a_dropout()
    rekeyed = SecAggClient(RUN, 4, PARAMS, KeyPair.generate())
    server.enroll(rekeyed.enroll_request())
    for i in (1, 2, 3):
        clients[i].on_directory(server.directory())
        clients[i] = SecAggClient.from_state_dict(clients[i].state_dict(), PARAMS)
    for i in request.survivors:
        server.receive_reveal(clients[i].reveal_masks(request))
    np.testing.assert_allclose(server.result().weighted_sum, np.full(3, 6.0), atol=1e-6)


def test_reveal_after_a_rekeyed_directory_never_silently_corrupts_the_sum():
    """protocol.py reveal_masks re-derives masks from the *current* seeds, not the ones the round was
    masked with. If node 4 is re-keyed between the masked update and the reveal, the survivor's reveal is
    computed with the new seed: the server decodes garbage without any error. The client must either
    reveal the round's own masks or refuse."""
    server, clients, directory, request = _round_with_a_dropout()
    rekeyed = SecAggClient(RUN, 4, PARAMS, KeyPair.generate())
    server.enroll(rekeyed.enroll_request())  # SecAggServer allows a re-enrollment at any time
    new_dir = server.directory()
    for i in (1, 2, 3):
        clients[i].on_directory(new_dir)
    for i in request.survivors:
        server.receive_reveal(clients[i].reveal_masks(request))
    res = server.result()
    np.testing.assert_allclose(res.weighted_sum, np.full(3, 6.0), atol=1e-6)


@pytest.mark.parametrize("case", ["enroll str key", "update str tag", "update int metric key",
                                  "reveal str tag", "reveal dropped None"])
def test_type_malformed_messages_raise_protocol_errors(case):
    """errors.py / protocol.py: 'Every message a state machine rejects raises a ProtocolError subclass ...
    the caller can catch that one class'. Fields of the wrong type escape as TypeError / AttributeError
    (observed: 'string argument without an encoding', "'int' object has no attribute 'encode'",
    "'NoneType' object is not iterable"), so a caller following the contract crashes on one bad message."""
    server, clients, _ = federation()
    ann = server.start_round(1, sorted(clients))
    mu = clients[1].masked_update(1, ann.selected, np.ones(3), 1.0, {"a": 0.5})
    if case == "enroll str key":
        call = lambda: server.enroll(EnrollRequest(RUN, 9, "not bytes"))  # noqa: E731
    elif case == "update str tag":
        call = lambda: server.receive(dataclasses.replace(mu, tag="x" * 16))  # noqa: E731
    elif case == "update int metric key":
        call = lambda: server.receive(dataclasses.replace(mu, metric_keys=(7,)))  # noqa: E731
    else:
        server, clients, _, request = _round_with_a_dropout()
        rev = clients[1].reveal_masks(request)
        bad = dataclasses.replace(rev, tag="x" * 16) if case == "reveal str tag" else \
            dataclasses.replace(rev, dropped=None)
        call = lambda: server.receive_reveal(bad)  # noqa: E731
    with pytest.raises(ProtocolError):
        call()
    assert server.phase in (Phase.COLLECTING, Phase.REVEALING)  # state unchanged


def test_a_secagg_message_with_numpy_integer_ids_is_not_malformed():
    """`check_u64` (common/secagg/keys.py), which the protocol uses for every id, takes numpy integers, and
    before this session's field checks `SecAggServer.enroll` accepted EnrollRequest(run, np.int64(node), key). The new field
    check (`_is_int` in common/secagg/messages.py) accepts only Python ints, so the same request is now a
    MalformedMessageError ("EnrollRequest.node_id must be an int, got int64"): a legitimate caller that took
    node ids from a numpy array is refused as hostile. `_is_int` should accept numpy integers
    (operator.index, as check_u64 does), or the messages convert."""
    from common.secagg.messages import EnrollRequest
    from common.secagg.protocol import SecAggClient, SecAggServer

    server, client = SecAggServer(7), SecAggClient(7, 3)
    server.enroll(EnrollRequest(7, np.int64(3), client.public_key))  # measured: MalformedMessageError
    assert 3 in server.enrolled
