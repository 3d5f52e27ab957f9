"""Secure-aggregation protocol: sums, dropouts, aborts, replays, late replies, client refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.secagg import (
    AuthenticationError,
    CodecParams,
    CodecRangeError,
    ContextMismatchError,
    Directory,
    DuplicateError,
    EnrollRequest,
    LateReplyError,
    MalformedMessageError,
    MaskedUpdate,
    MaskReveal,
    NotEnrolledError,
    Phase,
    ProtocolError,
    RefusedError,
    ReplayError,
    RevealRequest,
    RoundAborted,
    RoundAnnouncement,
    RoundClosedError,
    RoundNotReady,
    SecAggClient,
    SecAggParams,
    SecAggServer,
    UnexpectedSenderError,
    WrongRunError,
)

RUN = 0xDEADBEEF12345678
PARAMS = {
    "default64": SecAggParams(CodecParams(), min_survivors=3),
    "compact32": SecAggParams(CodecParams.compact(clip=1024.0, max_clients=16), min_survivors=3),
}


def enrolled(ids, params, run=RUN):
    """A server and clients `ids`, enrolled: (server, {id: client}, the directory relayed)."""
    server = SecAggServer(run, params)
    clients = {i: SecAggClient(run, i, params) for i in ids}
    for c in clients.values():
        server.enroll(c.enroll_request())
    directory = server.directory()
    for c in clients.values():
        c.on_directory(directory)
    return server, clients, directory


def federation(n=10, params=None, run=RUN, seed=0):
    """An enrolled server and n clients with random 64-bit node ids."""
    rng = np.random.default_rng(seed)
    ids = sorted({int(x) for x in rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)})
    return enrolled(ids, params or PARAMS["default64"], run)[:2]


def make_updates(clients, d, rng, scale=1.0):
    ups = {i: (rng.uniform(-scale, scale, d).astype(np.float32), float(rng.uniform(1, 200)),
               {"loss": float(rng.uniform(0, 3)), "acc": float(rng.uniform(0, 1))}) for i in clients}
    return ups


def plain_sums(ups, nodes, params):
    """float64 reference: sum w*u (float64 product, as the client computes it), sum w, sum metrics, with
    each weight on the codec's grid 2^-f first, as the client rounds it (so the mean is a weighted mean)."""
    scale = params.codec.scale
    w = {i: round(ups[i][1] * scale) / scale for i in nodes}
    ws = sum(w[i] * ups[i][0].astype(np.float64) for i in nodes)
    tw = sum(w.values())
    mets = {k: sum(ups[i][2][k] for i in nodes) for k in ("acc", "loss")}
    mag = sum(np.abs(w[i] * ups[i][0].astype(np.float64)) for i in nodes)
    return ws, tw, mets, mag


def assert_matches(res, ups, nodes, params):
    ws, tw, mets, mag = plain_sums(ups, nodes, params)
    n = len(nodes)
    bound = params.codec.sum_error_bound(n, 0.0) + 2.0**-50 * mag  # + float64 rounding of both sums
    assert np.all(np.abs(res.weighted_sum - ws) <= bound)
    assert abs(res.total_weight - tw) <= params.codec.sum_error_bound(n, tw) + 2.0**-50 * tw
    for k in mets:
        assert abs(res.metrics[k] - mets[k]) <= params.codec.sum_error_bound(n, mets[k]) + 1e-12
    assert sorted(res.survivors) == sorted(nodes)


def run_round(server, clients, ups, rnd, dropped=(), late=()):
    """One round: everyone selected, `dropped` never reply (those in `late` reply after the timeout)."""
    sel = sorted(clients)
    ann = server.start_round(rnd, sel)
    msgs = {i: clients[i].masked_update(rnd, ann.selected, *ups[i]) for i in sel if i not in dropped or i in late}
    for i in sel:
        if i not in dropped:
            server.receive(msgs[i])
    assert server.pending() == frozenset(dropped)
    req = server.declare_dropped()
    for i in late:
        with pytest.raises(LateReplyError):
            server.receive(msgs[i])
    if req is not None:
        assert req.dropped == tuple(sorted(dropped))
        for i in req.survivors:
            server.receive_reveal(clients[i].reveal_masks(req))
    return server.result()


# ------------------------------------------------------------------ correctness
@pytest.mark.parametrize("name", list(PARAMS))
def test_decoded_sum_equals_plain_weighted_sum(name):
    params = PARAMS[name]
    server, clients = federation(10, params)
    rng = np.random.default_rng(1)
    for rnd in (1, 2, 5):
        ups = make_updates(clients, 3001, rng, scale=1.0 if name == "compact32" else 50.0)
        res = run_round(server, clients, ups, rnd)
        assert res.dropped == () and res.round == rnd
        assert_matches(res, ups, list(clients), params)
        ws, tw, _, _ = plain_sums(ups, list(clients), params)
        np.testing.assert_allclose(res.weighted_mean(), ws / tw, atol=1e-6)
        assert server.phase is Phase.DONE
        assert server.result() is res  # idempotent


def test_one_round_trip_when_nobody_drops():
    server, clients = federation(4)
    rng = np.random.default_rng(2)
    ups = make_updates(clients, 10, rng)
    server.start_round(1, sorted(clients))
    for i, c in clients.items():
        server.receive(c.masked_update(1, sorted(clients), *ups[i]))
    assert server.pending() == frozenset()
    assert server.declare_dropped() is None  # no reveal round trip needed
    assert_matches(server.result(), ups, list(clients), PARAMS["default64"])


def test_masks_cancel_only_between_nodes_told_the_same_announcement():
    """The masks are bound to the announcement digest: with one node told something else (e.g. a weight
    scale that weighs the others to zero), the sum is noise instead of that node's update."""
    rng = np.random.default_rng(7)

    def round_with(told, gone):
        server, clients = federation(5)
        sel = sorted(clients)
        server.start_round(1, sel)
        for i in sel:
            if i not in gone:
                server.receive(clients[i].masked_update(1, sel, *ups[i], announcement=told(i, sel)))
        req = server.declare_dropped()
        if req is not None:
            for i in req.survivors:
                server.receive_reveal(clients[i].reveal_masks(req))
        return server.result()

    ups = make_updates(federation(5)[1], 50, rng)
    ids = sorted(ups)
    for gone in ((), (ids[0],)):  # nobody drops; one node drops and the survivors reveal
        survivors = [i for i in ids if i not in gone]
        assert_matches(round_with(lambda i, sel: b"A" * 32, gone), ups, survivors, PARAMS["default64"])
        try:
            res = round_with(lambda i, sel: b"B" * 32 if i == sel[-1] else b"A" * 32, gone)
        except (RoundAborted, ProtocolError):
            continue  # undecodable: also no update learned
        ws, _, _, _ = plain_sums(ups, survivors, PARAMS["default64"])
        assert np.abs(res.weighted_sum - ws).max() > 1e6  # uniform words: nothing of the update survives


def test_subset_selection_and_small_ids():
    params = SecAggParams(CodecParams(), min_survivors=2)
    server = SecAggServer(0, params)
    clients = {i: SecAggClient(0, i, params) for i in (0, 1, 2, 2**64 - 1)}
    for c in clients.values():
        server.enroll(c.enroll_request())
    for c in clients.values():
        c.on_directory(server.directory())
    rng = np.random.default_rng(3)
    ups = make_updates(clients, 50, rng)
    sel = [0, 2**64 - 1]
    server.start_round(1, sel)
    for i in sel:
        server.receive(clients[i].masked_update(1, sel, *ups[i]))
    assert_matches(server.result(), ups, sel, params)


# ------------------------------------------------------------------ dropouts
@pytest.mark.parametrize("name", list(PARAMS))
def test_dropout_of_any_1_to_n_minus_min_clients_is_recovered(name):
    params = PARAMS[name]
    n = 10
    server, clients = federation(n, params, seed=4)
    rng = np.random.default_rng(5)
    ids = sorted(clients)
    rnd = 0
    for count in range(1, n - params.min_survivors + 1):
        for _trial in range(3):
            rnd += 1
            dropped = tuple(sorted(ids[k] for k in rng.choice(n, count, replace=False)))
            late = tuple(x for x in dropped if rng.random() < 0.5)  # some reply after the timeout
            ups = make_updates(clients, 257, rng)
            res = run_round(server, clients, ups, rnd, dropped=dropped, late=late)
            survivors = [i for i in ids if i not in dropped]
            assert res.dropped == dropped
            assert_matches(res, ups, survivors, params)


def test_abort_below_minimum_survivors_and_late_reply_rejected():
    params = PARAMS["default64"]
    server, clients = federation(6, params)
    rng = np.random.default_rng(6)
    ups = make_updates(clients, 20, rng)
    ids = sorted(clients)
    server.start_round(1, ids)
    msgs = {i: clients[i].masked_update(1, ids, *ups[i]) for i in ids}
    for i in ids[:2]:  # only 2 < min_survivors=3 reply in time
        server.receive(msgs[i])
    assert server.declare_dropped() is None
    assert server.phase is Phase.ABORTED
    with pytest.raises(RoundAborted, match="min_survivors"):
        server.result()
    with pytest.raises(LateReplyError):
        server.receive(msgs[ids[3]])
    # next round works normally
    ups = make_updates(clients, 20, rng)
    assert_matches(run_round(server, clients, ups, 2), ups, ids, params)


def test_survivor_that_does_not_reveal_aborts_the_round():
    server, clients = federation(6)
    rng = np.random.default_rng(7)
    ups = make_updates(clients, 20, rng)
    ids = sorted(clients)
    server.start_round(1, ids)
    for i in ids[1:]:
        server.receive(clients[i].masked_update(1, ids, *ups[i]))
    req = server.declare_dropped()
    assert server.declare_dropped() == req  # idempotent, for re-sending
    for i in req.survivors[:-1]:
        server.receive_reveal(clients[i].reveal_masks(req))
    with pytest.raises(RoundNotReady):
        server.result()
    server.declare_reveal_timeout()
    with pytest.raises(RoundAborted, match="did not reveal"):
        server.result()
    with pytest.raises(RoundClosedError):
        server.receive_reveal(clients[req.survivors[-1]].reveal_masks(req))


def test_dropped_node_cannot_reveal_or_reply_late():
    server, clients = federation(5)
    rng = np.random.default_rng(8)
    ups = make_updates(clients, 20, rng)
    ids = sorted(clients)
    server.start_round(1, ids)
    late_msg = clients[ids[0]].masked_update(1, ids, *ups[ids[0]])
    for i in ids[1:]:
        server.receive(clients[i].masked_update(1, ids, *ups[i]))
    req = server.declare_dropped()
    with pytest.raises(LateReplyError):
        server.receive(late_msg)
    with pytest.raises(RefusedError):  # the dropped client refuses too: it is not a survivor
        clients[ids[0]].reveal_masks(req)
    for i in req.survivors:
        server.receive_reveal(clients[i].reveal_masks(req))
    with pytest.raises(LateReplyError):
        server.receive(late_msg)  # still rejected after decoding
    assert_matches(server.result(), ups, ids[1:], PARAMS["default64"])


# ------------------------------------------------------------------ replays and bad messages
def test_replayed_vector_from_another_round_is_rejected():
    server, clients = federation(4)
    rng = np.random.default_rng(9)
    ids = sorted(clients)
    ups1 = make_updates(clients, 30, rng)
    server.start_round(1, ids)
    old = {i: clients[i].masked_update(1, ids, *ups1[i]) for i in ids}
    for m in old.values():
        server.receive(m)
    server.result()

    ups2 = make_updates(clients, 30, rng)
    server.start_round(2, ids)
    a = ids[0]
    with pytest.raises(ReplayError):  # as captured
        server.receive(old[a])
    with pytest.raises(ContextMismatchError):  # round number rewritten
        server.receive(dataclasses.replace(old[a], round=2))
    new_a = clients[a].masked_update(2, ids, *ups2[a])
    with pytest.raises(AuthenticationError):  # round and context rewritten: tag fails
        server.receive(dataclasses.replace(old[a], round=2, context=new_a.context))
    with pytest.raises(WrongRunError):
        server.receive(dataclasses.replace(new_a, run_id=RUN + 1))
    b = ids[1]
    with pytest.raises(AuthenticationError):  # another sender's vector under a's name
        new_b = clients[b].masked_update(2, ids, *ups2[b])
        server.receive(dataclasses.replace(new_b, node_id=a))
    tampered = new_a.masked.copy()
    tampered[3] += np.uint64(1)
    with pytest.raises(AuthenticationError):
        server.receive(dataclasses.replace(new_a, masked=tampered))
    with pytest.raises(AuthenticationError):  # what the words mean is authenticated with them
        server.receive(dataclasses.replace(new_a, layout="other"))
    # none of the rejections changed the state: the honest round still decodes
    server.receive(new_a)
    with pytest.raises(DuplicateError):
        server.receive(new_a)
    server.receive(new_b)
    for i in ids[2:]:
        server.receive(clients[i].masked_update(2, ids, *ups2[i]))
    assert_matches(server.result(), ups2, ids, PARAMS["default64"])
    with pytest.raises(ReplayError):
        server.receive(old[a])


def test_server_rejects_unexpected_and_malformed_messages():
    server, clients = federation(5)
    rng = np.random.default_rng(10)
    ids = sorted(clients)
    ups = make_updates(clients, 30, rng)
    sel = ids[:4]
    outsider = ids[4]
    server.start_round(1, sel, dim=30)
    with pytest.raises(RefusedError):  # the outsider refuses a set without itself
        clients[outsider].masked_update(1, sel, *ups[outsider])
    m_out = clients[outsider].masked_update(1, ids, *ups[outsider])
    with pytest.raises(UnexpectedSenderError):
        server.receive(m_out)
    with pytest.raises(ContextMismatchError):  # masked for another selected set
        server.receive(clients[sel[0]].masked_update(1, ids, *ups[sel[0]]))
    with pytest.raises(MalformedMessageError):
        server.receive({"not": "a message"})
    m = clients[sel[1]].masked_update(1, sel, *ups[sel[1]])
    with pytest.raises(MalformedMessageError):
        server.receive(dataclasses.replace(m, masked=m.masked.astype(np.uint32)))
    with pytest.raises(UnexpectedSenderError):  # no reveal requested
        server.receive_reveal(MaskReveal(RUN, 1, sel[1], (sel[0],), m.masked, b"x" * 16))
    server.receive(m)
    # an authentic vector of the wrong length is here, so its sender cannot be dropped and its masks
    # revealed (that would unmask it): the round aborts
    short = clients[sel[2]].masked_update(1, sel, ups[sel[2]][0][:10], 1.0, ups[sel[2]][2])
    with pytest.raises(MalformedMessageError, match="length"):
        server.receive(short)
    assert server.declare_dropped() is None
    with pytest.raises(RoundAborted, match="cannot be used"):
        server.result()
    for n in sel[3:]:
        with pytest.raises(RoundClosedError):
            server.receive(clients[n].masked_update(1, sel, *ups[n]))


def test_a_refused_node_is_never_a_reveal_target():
    """The grid refuses a vector it received but cannot use (e.g. its layout is not the round's): the
    round aborts, so no survivor is ever asked for its masks with that node."""
    server, clients = federation(4)
    rng = np.random.default_rng(11)
    ids = sorted(clients)
    ups = make_updates(clients, 20, rng)
    server.start_round(1, ids, dim=20)
    for n in ids[:3]:
        server.receive(clients[n].masked_update(1, ids, *ups[n]))
    server.refuse(ids[3], "its layout differs")
    assert not server.collecting() and server.declare_dropped() is None
    with pytest.raises(RoundAborted, match=f"node {ids[3]}"):
        server.result()


def test_server_round_and_selection_validation():
    server, clients = federation(5)
    ids = sorted(clients)
    with pytest.raises(RoundNotReady):
        server.result()
    with pytest.raises(ValueError):
        server.start_round(1, ids[:2])  # < min_survivors
    with pytest.raises(NotEnrolledError):
        server.start_round(1, ids[:3] + [12345])
    server.start_round(3, ids)
    with pytest.raises(ValueError):
        server.start_round(3, ids)  # rounds strictly increase
    tiny = SecAggParams(CodecParams(mod_bits=32, frac_bits=10, clip=10.0, max_clients=4), min_survivors=2)
    s2, _ = federation(5, tiny)
    with pytest.raises(ValueError, match="headroom"):
        s2.start_round(1, sorted(_))
    with pytest.raises(WrongRunError):
        server.enroll(EnrollRequest(RUN + 1, 5, clients[ids[0]].public_key))
    with pytest.raises(MalformedMessageError):
        server.enroll(EnrollRequest(RUN, 5, b"\x00" * 32))  # low-order key


def test_parameter_mismatch_is_a_clear_rejection():
    server, clients = federation(4, PARAMS["default64"])
    other = SecAggParams(CodecParams(frac_bits=31), min_survivors=3)
    ids = sorted(clients)
    c = SecAggClient(RUN, ids[0], other, keypair=clients[ids[0]]._kp)
    c.on_directory(server.directory())
    server.start_round(1, ids)
    with pytest.raises(ContextMismatchError):
        server.receive(c.masked_update(1, ids, np.zeros(3), 1.0))


def test_reenrollment_with_a_new_key_and_stale_directory():
    server, clients = federation(4)
    ids = sorted(clients)
    a = ids[0]
    clients[a] = SecAggClient(RUN, a, PARAMS["default64"])  # node restarted, new key
    server.enroll(clients[a].enroll_request())
    rng = np.random.default_rng(11)
    ups = make_updates(clients, 40, rng)
    server.start_round(1, ids)
    with pytest.raises(NotEnrolledError):
        clients[a].masked_update(1, ids, *ups[a])  # has no directory yet
    clients[a].on_directory(server.directory())
    stale = clients[ids[1]].masked_update(1, ids, *ups[ids[1]])  # still the old key of a
    with pytest.raises(ContextMismatchError):
        server.receive(stale)
    for i in ids:
        clients[i].on_directory(server.directory())
    server.start_round(2, ids)
    for i in ids:
        server.receive(clients[i].masked_update(2, ids, *ups[i]))
    assert_matches(server.result(), ups, ids, PARAMS["default64"])


def test_directory_must_list_the_clients_own_key():
    server, clients = federation(3)
    ids = sorted(clients)
    d = server.directory()
    forged = Directory(d.run_id, d.server_public_key, {**d.public_keys, ids[0]: d.public_keys[ids[1]]})
    with pytest.raises(ContextMismatchError):
        clients[ids[0]].on_directory(forged)
    with pytest.raises(WrongRunError):
        clients[ids[0]].on_directory(Directory(RUN + 1, d.server_public_key, d.public_keys))


# ------------------------------------------------------------------ client refusals
def test_client_refuses_mask_reuse_and_unsafe_selected_sets():
    server, clients = federation(5)
    ids = sorted(clients)
    c = clients[ids[0]]
    c.masked_update(4, ids, np.ones(3), 1.0)
    for rnd in (4, 3):
        with pytest.raises(RefusedError, match="already used"):
            c.masked_update(rnd, ids, np.ones(3), 1.0)
    with pytest.raises(RefusedError, match="min_survivors"):
        c.masked_update(5, ids[:2], np.ones(3), 1.0)  # a tiny set would expose the vector
    with pytest.raises(RefusedError, match="not in the selected"):
        c.masked_update(5, ids[1:], np.ones(3), 1.0)
    with pytest.raises(NotEnrolledError):
        c.masked_update(5, ids + [999], np.ones(3), 1.0)
    with pytest.raises(ValueError):
        c.masked_update(5, ids, np.ones(3), -1.0)
    with pytest.raises(ValueError):
        c.masked_update(5, ids, np.ones((2, 2)), 1.0)
    fresh = SecAggClient(RUN, 1, PARAMS["default64"])
    with pytest.raises(NotEnrolledError):
        fresh.masked_update(1, ids, np.ones(3), 1.0)


def test_client_out_of_range_names_the_entry():
    server, clients = federation(3, PARAMS["compact32"])
    ids = sorted(clients)
    c = clients[ids[0]]
    u = np.zeros(10, dtype=np.float32)
    u[6] = 20.0
    with pytest.raises(CodecRangeError, match=r"update\[6\]"):
        c.masked_update(1, ids, u, 100.0)  # 100 * 20 > clip 1024
    with pytest.raises(CodecRangeError, match="metric 'loss'"):
        c.masked_update(1, ids, np.zeros(3), 1.0, {"loss": 1e6})
    with pytest.raises(CodecRangeError, match="weight"):
        c.masked_update(1, ids, np.zeros(3), 5000.0)
    with pytest.raises(CodecRangeError):
        c.masked_update(1, ids, np.array([np.nan]), 1.0)
    m = c.masked_update(1, ids, u, 100.0, clip=True)  # explicit clipping is allowed
    assert m.round == 1


def test_reveal_rules():
    server, clients = federation(6)
    ids = sorted(clients)
    a, b, c, d = ids[0], ids[1], ids[2], ids[3]
    ca = clients[a]
    with pytest.raises(RefusedError):  # nothing sent yet
        ca.reveal_masks(RevealRequest(RUN, 1, tuple(ids[:5]), (ids[5],)))
    ca.masked_update(2, ids, np.ones(4), 1.0)
    ok = RevealRequest(RUN, 2, tuple(x for x in ids if x != d), (d,))
    bad = [
        (RevealRequest(RUN + 1, 2, ok.survivors, ok.dropped), "run"),
        (RevealRequest(RUN, 3, ok.survivors, ok.dropped), "latest masked update"),  # future round
        (RevealRequest(RUN, 1, ok.survivors, ok.dropped), "latest masked update"),  # other round
        (RevealRequest(RUN, 2, tuple(ids), ()), "no dropped"),
        (RevealRequest(RUN, 2, tuple(x for x in ids if x != a), (a,)), "declared dropped"),
        (RevealRequest(RUN, 2, (a, b, c), (d,)), "partition"),  # others omitted
        (RevealRequest(RUN, 2, (a, b), tuple(ids[2:])), "min_survivors"),
    ]
    for req, match in bad:
        with pytest.raises(RefusedError, match=match):
            ca.reveal_masks(req)
    r1 = ca.reveal_masks(ok)
    r1b = ca.reveal_masks(ok)  # identical re-request (retransmission) is answered identically
    np.testing.assert_array_equal(r1.masks, r1b.masks)
    assert r1.tag == r1b.tag
    # once told b survived, a never reveals its masks with b in this round
    with pytest.raises(RefusedError, match="one dropped set per round"):
        ca.reveal_masks(RevealRequest(RUN, 2, tuple(x for x in ids if x not in (b, d)), (b, d)))
    # after masking a newer round, round 2 can no longer be revealed
    ca.masked_update(3, ids, np.ones(4), 1.0)
    with pytest.raises(RefusedError):
        ca.reveal_masks(ok)


# ------------------------------------------------------------------ transport and persistence
def test_messages_round_trip_through_dicts():
    server, clients = federation(4)
    ids = sorted(clients)
    rng = np.random.default_rng(12)
    ups = make_updates(clients, 25, rng)
    c0 = clients[ids[0]]
    assert EnrollRequest.from_dict(c0.enroll_request().to_dict()) == c0.enroll_request()
    d = Directory.from_dict(server.directory().to_dict())
    assert dict(d.public_keys) == dict(server.directory().public_keys)
    ann = RoundAnnouncement.from_dict(server.start_round(1, ids).to_dict())
    assert ann.selected == tuple(ids)
    for i in ids[1:]:
        m = clients[i].masked_update(1, ann.selected, *ups[i])
        server.receive(MaskedUpdate.from_dict(m.to_dict()))
    req = RevealRequest.from_dict(server.declare_dropped().to_dict())
    for i in req.survivors:
        server.receive_reveal(MaskReveal.from_dict(clients[i].reveal_masks(req).to_dict()))
    assert_matches(server.result(), ups, ids[1:], PARAMS["default64"])


def test_client_state_dict_round_trip():
    params = PARAMS["default64"]
    server, clients = federation(4, params)
    ids = sorted(clients)
    a = ids[0]
    u = np.linspace(-1, 1, 17)
    m1 = clients[a].masked_update(1, ids, u, 2.0)
    restored = SecAggClient.from_state_dict(clients[a].state_dict(), params)
    assert restored.public_key == clients[a].public_key and restored.last_round == 1
    with pytest.raises(RefusedError):
        restored.masked_update(1, ids, u, 2.0)
    m2a = clients[a].masked_update(2, ids, u, 2.0)
    m2b = restored.masked_update(2, ids, u, 2.0)
    np.testing.assert_array_equal(m2a.masked, m2b.masked)
    assert m2a.tag == m2b.tag and not np.array_equal(m1.masked, m2a.masked)
    state = restored.state_dict()
    assert not any(s in repr(state).encode() for s in restored._seeds.values())
    with pytest.raises(ValueError):
        SecAggClient.from_state_dict(state, SecAggParams(CodecParams.compact(), min_survivors=3))


def test_protocol_errors_share_a_base_class():
    for exc in (WrongRunError, ReplayError, DuplicateError, UnexpectedSenderError, LateReplyError,
                RoundClosedError, ContextMismatchError, MalformedMessageError, AuthenticationError):
        assert issubclass(exc, ProtocolError)


def test_full_size_round_with_dropouts():
    """10 clients, 10^6 floats, two dropped: the benchmark-sized round decodes correctly."""
    params = SecAggParams(CodecParams(), min_survivors=3)
    server, clients = federation(10, params)
    rng = np.random.default_rng(13)
    ups = make_updates(clients, 10**6, rng)
    ids = sorted(clients)
    res = run_round(server, clients, ups, 1, dropped=tuple(ids[:2]))
    assert_matches(res, ups, ids[2:], params)
