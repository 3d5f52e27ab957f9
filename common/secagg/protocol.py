"""The secure-aggregation protocol as two pure state machines (no Flower, no I/O).

`SecAggClient` runs on each node, `SecAggServer` on the server; the caller (the
secure-aggregation grid) moves their messages (`messages.py`). Every message a
state machine rejects raises a `ProtocolError` subclass and leaves its state
unchanged; every request a client judges unsafe raises `RefusedError`.

Enrollment (once per run, or again when the node set changes)
    1. each client sends `enroll_request()`: its X25519 public key;
    2. the server `enroll()`s them and relays `directory()`: all public keys and
       the server's own per-run public key;
    3. each client `on_directory()`: derives its pairwise seed with every peer
       (`keys.pair_seed`) and its tag key with the server. Seeds are computed
       locally and never leave the client (they are not even in its
       `state_dict()`, which stores the private key and re-derives them).

A round t, nobody drops (one round trip)
    1. the server `start_round(t, selected)` -> `RoundAnnouncement` (sent with
       the model);
    2. each selected client i: `masked_update(t, selected, u_i, w_i, metrics_i)`
       encodes x_i = [w_i * u_i, w_i, metrics_i] in fixed point (`codec.py`),
       adds sum_{j in selected, j != i} sign(i, j) G(seed_ij, t) mod 2^k
       (`masking.py`), and tags the result (`auth.py`);
    3. the server `receive()`s each reply (validates, adds it to a running sum,
       keeps nothing else) and `result()` decodes sum_i x_i: the weighted sum of
       updates, the total weight and the summed metrics. The server learns only
       these sums (metric values are summed as given; pass w_i * m_i to get a
       weighted mean).

Dropouts (one more round trip, only when someone drops)
    4. on timeout the server `declare_dropped()`: every selected node that has
       not replied is dropped *for good in this round*: a reply from it that
       arrives later raises `LateReplyError` and is never added (keeping it
       would let the server unmask it with the reveals). If fewer than
       `min_survivors` replied, the round is aborted (`result()` raises
       `RoundAborted`; the caller leaves the model unchanged). Otherwise it
       returns a `RevealRequest(survivors, dropped)` for every survivor;
    5. each survivor s: `reveal_masks(request)` returns only
       R_s = sum_{d in dropped} sign(s, d) G(seed_sd, t) mod 2^k: the round-t
       masks, summed, never a seed (future rounds' masks stay secret);
    6. the server `receive_reveal()`s them and `result()` decodes
       sum_s y_s - sum_s R_s = sum_s x_s. A survivor that does not reveal
       (`declare_reveal_timeout()`) aborts the round: its masks with the
       dropped nodes cannot be removed otherwise (the grid then leaves it out
       of later rounds if other survivors revealed: server/secagg_grid.py).

Client rules (what a curious or malicious server cannot make a client do)
    * masked_update:
      - at most one masked vector per round, rounds strictly increasing: two
        vectors under the same round's masks would reveal their difference;
      - the selected set must contain the client, only enrolled peers, at least
        `min_survivors` nodes (a set {i} alone would send x_i unmasked) and at
        most `codec.max_clients` (headroom).
    * reveal_masks (the only request that releases mask material):
      - only for the round of the client's latest masked vector: never for a
        round in which it sent nothing, never for a future round (that would
        unmask its next vector), never for an older round once it has masked
        a newer one;
      - survivors and dropped must partition exactly the selected set the
        client masked against, the client itself must be a survivor, `dropped`
        must be non-empty and survivors >= `min_survivors`;
      - at most one dropped set per round: once told who survived, it never
        reveals masks with any of those survivors (a second, different request
        in the same round is refused; an identical one is answered again, for
        retransmission). Hence the server can never obtain client i's masks
        with a peer that i was told survived, and it cannot peel i's masks off
        one peer at a time.

Threat model and limits. Secure against an honest-but-curious server and
clients and a passive eavesdropper (the paper's model): the server sees only
masked vectors (uniform in Z_(2^k) given any one unrevealed mask), the sums
and, on dropouts, sums of round masks with dropped nodes. Without self-masks
and secret sharing (Bonawitz et al.'s double masking, which costs extra round
trips every round) an actively malicious server can still learn x_j by
*falsely* declaring a client j dropped after receiving its vector, or by
telling different survivors different dropped sets; the client-side rules
above make it impossible without such lies. Telling nodes different things
in the round announcement (another weight scale, to weigh every other node to
zero; other unit-weight records; another selected set) gains nothing: the
masks are bound to a digest of the announcement (`masked_update(...,
announcement=)`, `prf.round_key`) and cancel only between nodes told the same.
The per-node training instructions (local steps, learning rate, the model
sent) are not bound, as strategies legitimately differ per node there
(stragglers); an actively malicious server could use them to shrink the
other nodes' contributions. The honest server never holds a
dropped client's vector: a late reply is refused (`LateReplyError`), and a
vector that arrives but cannot be used aborts the round (`refuse`) instead of
dropping its sender. The transport: in Flower's runtime a reply that misses
the timeout would still be stored by the SuperLink, where whoever runs it could
read it and, after the reveals, unmask it. The server's grid therefore gives
each masked round's instructions the round timeout as their TTL
(`server/secagg_grid.py`): the SuperLink neither hands out an expired
instruction nor stores a reply to one, and the server pulls until the
deadline (`poll-interval` > 0, the default). A reply stored in the last poll
interval before expiry is deleted with its expired instruction, so its sender
counts as dropped: the server never sees that vector. What remains is clock skew
between the ServerApp's and the SuperLink's hosts (the TTL counts from the
ServerApp's clock), and a SuperLink operator who patches Flower to keep expired
replies; double masking would close both, at extra round trips per round.
Public keys are relayed without a PKI (see `keys.py`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from common.number_checks import is_int
from .auth import KIND_REVEAL, KIND_UPDATE, compute_tag, verify_tag
from .codec import CodecParams, CodecRangeError, FixedPointCodec
from .errors import (
    AuthenticationError,
    ContextMismatchError,
    DuplicateError,
    LateReplyError,
    MalformedMessageError,
    NotEnrolledError,
    RefusedError,
    ReplayError,
    RoundAborted,
    RoundClosedError,
    RoundNotReady,
    UnexpectedSenderError,
    WrongRunError,
)
from .keys import PUBLIC_KEY_BYTES, KeyPair, check_u64, pair_seed, server_mac_key
from .masking import add_pairwise_masks, pairwise_mask_sum, reduce_mod
from .messages import (
    Directory,
    EnrollRequest,
    MaskedUpdate,
    MaskReveal,
    RevealRequest,
    RoundAnnouncement,
    _ids,
    field_problem,
    round_context,
)
from .prf import MaskGenerator

__all__ = ["SecAggParams", "SecAggClient", "SecAggServer", "AggregateResult", "Phase"]


@dataclass(frozen=True)
class SecAggParams:
    """What client and server must agree on: the codec and the minimum number of survivors.

    min_survivors >= 2 (a "sum" of one is that client's value). Both sides
    build it from the same run config; its fingerprint is bound into every
    masked update's context, so a mismatch is a clear `ContextMismatchError`.
    """

    codec: CodecParams = field(default_factory=CodecParams)
    min_survivors: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.codec, CodecParams):
            raise TypeError("SecAggParams.codec must be a CodecParams")
        if not is_int(self.min_survivors):
            raise TypeError(f"min_survivors must be an int, got {self.min_survivors!r}")
        if self.min_survivors < 2:
            raise ValueError(f"min_survivors must be >= 2, got {self.min_survivors}")
        if self.min_survivors > self.codec.max_clients:
            raise ValueError(
                f"min_survivors={self.min_survivors} exceeds codec.max_clients={self.codec.max_clients}"
            )

    def fingerprint(self) -> bytes:
        """SHA-256 over the codec fingerprint and min_survivors."""
        return hashlib.sha256(
            b"privfed/secagg/v1/params" + self.codec.fingerprint() + struct.pack(">I", self.min_survivors)
        ).digest()


@dataclass(frozen=True)
class AggregateResult:
    """The decoded round: sums over the survivors only.

    weighted_sum = sum_s w_s * u_s (float64), total_weight = sum_s w_s,
    metrics[k] = sum_s metrics_s[k]. Each is within
    `codec.sum_error_bound(len(survivors), |sum|)` of the exact float64 sum.
    """

    run_id: int
    round: int
    weighted_sum: np.ndarray
    total_weight: float
    metrics: Mapping[str, float]
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]

    def weighted_mean(self) -> np.ndarray:
        """weighted_sum / total_weight (ValueError if the total weight is not positive)."""
        if not self.total_weight > 0:
            raise ValueError(f"total weight {self.total_weight} is not positive")
        return self.weighted_sum / self.total_weight


class Phase(enum.Enum):
    """Server round phase."""

    IDLE = "idle"  # no round started yet
    COLLECTING = "collecting"  # waiting for masked updates
    REVEALING = "revealing"  # dropouts declared, waiting for survivors' reveals
    DONE = "done"  # decoded
    ABORTED = "aborted"  # cannot be decoded; model must stay unchanged


def _check_message(msg: Any, kind: type) -> None:
    """MalformedMessageError unless `msg` is a `kind` whose fields have their types."""
    if not isinstance(msg, kind):
        raise MalformedMessageError(f"expected {kind.__name__}, got {type(msg).__name__}")
    if problem := field_problem(msg):
        raise MalformedMessageError(problem)


def _check_weight(weight: Any) -> float:
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise TypeError(f"weight must be a real number, got {weight!r}") from None
    if not math.isfinite(w) or w < 0:
        raise ValueError(f"weight must be finite and >= 0, got {weight!r}")
    return w


def _check_vector(vector: Any) -> np.ndarray:
    v = np.asarray(vector)
    if v.ndim != 1:
        raise ValueError(f"update must be a flat 1-D vector, got shape {v.shape}")
    if not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
        raise TypeError(f"update must be a real array, got dtype {v.dtype}")
    return v


class SecAggClient:
    """One node's side of the protocol (see module docstring for the rules)."""

    def __init__(
        self,
        run_id: int,
        node_id: int,
        params: SecAggParams | None = None,
        keypair: KeyPair | None = None,
    ) -> None:
        self.run_id = check_u64("run_id", run_id)
        self.node_id = check_u64("node_id", node_id)
        self.params = params if params is not None else SecAggParams()
        self.codec = FixedPointCodec(self.params.codec)
        self._kp = keypair if keypair is not None else KeyPair.generate()
        self._fp = self.params.fingerprint()
        self._peer_keys: dict[int, bytes] = {}
        self._seeds: dict[int, bytes] = {}  # secret; never serialised, never sent
        self._server_pk: bytes | None = None
        self._mac_key: bytes | None = None
        # state of the latest masked round
        self._last_round: int | None = None
        self._round_selected: tuple[int, ...] = ()
        self._round_length = 0
        self._round_announcement = b""  # the digest the round's masks are bound to (prf.round_key)
        self._round_keys: dict[int, bytes] = {}  # the selected peers' public keys the round was masked with
        self._revealed: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._gen: MaskGenerator | None = None

    # -- enrollment -------------------------------------------------------
    @property
    def public_key(self) -> bytes:
        """This client's 32-byte X25519 public key."""
        return self._kp.public_bytes

    @property
    def enrolled(self) -> bool:
        """True once a directory has been processed."""
        return self._mac_key is not None

    @property
    def peers(self) -> frozenset[int]:
        """Node ids this client shares a pairwise seed with."""
        return frozenset(self._seeds)

    @property
    def last_round(self) -> int | None:
        """The round of the latest masked update (None before the first)."""
        return self._last_round

    def enroll_request(self) -> EnrollRequest:
        """The message that enrolls this client: its public key."""
        return EnrollRequest(self.run_id, self.node_id, self.public_key)

    def on_directory(self, directory: Directory) -> None:
        """Derive the pairwise seed with every peer listed, and the tag key with the server.

        Idempotent; a later directory (new nodes, a re-keyed node) updates the
        seeds of changed peers and forgets nodes no longer listed.
        """
        _check_message(directory, Directory)
        if directory.run_id != self.run_id:
            raise WrongRunError(f"directory is for run {directory.run_id}, this is run {self.run_id}")
        mine = directory.public_keys.get(self.node_id)
        if mine is None or bytes(mine) != self.public_key:
            raise ContextMismatchError(
                f"the directory does not list this node's public key under node id {self.node_id}"
            )
        server_pk = bytes(directory.server_public_key)
        if len(server_pk) != PUBLIC_KEY_BYTES:
            raise MalformedMessageError("server public key must be 32 bytes")
        keys: dict[int, bytes] = {}
        seeds: dict[int, bytes] = {}
        for peer, pk in directory.public_keys.items():
            peer = check_u64("node id", peer)
            pk = bytes(pk)
            if peer == self.node_id:
                continue
            if len(pk) != PUBLIC_KEY_BYTES:
                raise MalformedMessageError(f"public key of node {peer} must be 32 bytes")
            keys[peer] = pk
            if self._peer_keys.get(peer) == pk and peer in self._seeds:
                seeds[peer] = self._seeds[peer]
            else:
                try:
                    seeds[peer] = pair_seed(self._kp, pk, self.run_id, self.node_id, peer)
                except ValueError as exc:  # low-order / invalid point
                    raise MalformedMessageError(f"public key of node {peer} is invalid: {exc}") from None
        mac_key = self._mac_key
        if server_pk != self._server_pk or mac_key is None:
            try:
                mac_key = server_mac_key(self._kp, server_pk, self.run_id, self.node_id, self.public_key, server_pk)
            except ValueError as exc:  # low-order / invalid point
                raise MalformedMessageError(f"the server's public key is invalid: {exc}") from None
        self._mac_key = mac_key
        self._server_pk = server_pk
        self._peer_keys = keys
        self._seeds = seeds

    def _key_of(self, node: int) -> bytes:
        return self.public_key if node == self.node_id else self._peer_keys[node]

    def _generator(self) -> MaskGenerator:
        if self._gen is None:
            self._gen = MaskGenerator(self.params.codec.mod_bits)
        return self._gen

    # -- a round ----------------------------------------------------------
    def check_round(self, round: int, selected: Any) -> tuple[int, tuple[int, ...]]:
        """(round, sorted selected) if this client may mask for them; else RefusedError / NotEnrolledError.

        `masked_update` runs it; a caller runs it first, before the local update, so that an
        announcement it will refuse costs no training and no privacy budget.
        """
        if not self.enrolled:
            raise NotEnrolledError("masked_update before on_directory")
        round_ = check_u64("round", round)
        if self._last_round is not None and round_ <= self._last_round:
            raise RefusedError(
                f"round {round_} is not after round {self._last_round}, whose masks are already"
                " used: the same masks never cover two vectors"
            )
        sel = _ids(selected, "selected")
        if self.node_id not in sel:
            raise RefusedError(f"node {self.node_id} is not in the selected set")
        if len(sel) < self.params.min_survivors:
            raise RefusedError(
                f"selected set has {len(sel)} nodes, fewer than min_survivors={self.params.min_survivors}"
            )
        if len(sel) > self.params.codec.max_clients:
            raise RefusedError(
                f"selected set has {len(sel)} nodes, more than the codec headroom"
                f" max_clients={self.params.codec.max_clients}"
            )
        unknown = [j for j in sel if j != self.node_id and j not in self._seeds]
        if unknown:
            raise NotEnrolledError(f"no pairwise seed with selected nodes {unknown}: re-run enrollment")
        return round_, sel

    def masked_update(
        self,
        round: int,
        selected: Any,
        vector: Any,
        weight: float = 1.0,
        metrics: Mapping[str, float] | None = None,
        *,
        clip: bool = False,
        layout: str = "",
        announcement: bytes = b"",
    ) -> MaskedUpdate:
        """Encode [weight * vector, weight, metrics], add this round's pairwise masks, tag it.

        `vector` is a flat real array (the model update), `weight` >= 0 (e.g.
        the number of examples), `metrics` a {name: value} dict whose values the
        server learns only as sums, `layout` the caller's description of what
        the vector's entries mean (array names and shapes), which the tag
        covers so that nobody on the way can make the server misread them; `announcement`, a digest of
        everything the server told this node about the round, which the masks are bound to (they cancel
        only between nodes told the same). A value outside the codec's clip bound
        raises `CodecRangeError` naming it unless `clip=True`. Raises
        `RefusedError` for an unsafe request (see module docstring).
        """
        round_, sel = self.check_round(round, selected)
        v = _check_vector(vector)
        w = _check_weight(weight)
        metrics = dict(metrics or {})
        keys = tuple(sorted(str(k) for k in metrics))
        if len(keys) != len(metrics):
            raise ValueError("metric names must be distinct strings")
        mvals = np.array([float(metrics[k]) for k in keys], dtype=np.float64)

        d = v.shape[0]
        length = d + 1 + len(keys)
        scale = np.float64(self.params.codec.scale)
        # w on the codec's grid first: the weight slot is then exact and the same w multiplies u, so the
        # decoded sum(w u) / sum(w) is the weighted mean with these weights, within the sum bound / sum(w)
        w = float(np.rint(w * scale) / scale)
        x = np.empty(length, dtype=np.float64)  # [w*u, w, metrics] * 2^f (exact power-of-two scaling)
        np.multiply(v, np.float64(w) * scale, out=x[:d], casting="unsafe")
        x[d] = w * scale
        x[d + 1:] = mvals * scale
        try:
            words = self.codec.encode_scaled_inplace(x, clip=clip)
        except CodecRangeError as exc:
            i = exc.index
            if i < d:
                what = f"weight * update[{i}] = {exc.value!r} (update[{i}] = {v[i]!r}, weight = {w!r})"
            elif i == d:
                what = f"weight = {exc.value!r}"
            else:
                what = f"metric {keys[i - d - 1]!r} = {exc.value!r}"
            raise CodecRangeError(
                f"{what} is outside the codec's clip bound [-{exc.bound}, {exc.bound}];"
                " pass clip=True to clip explicitly or choose a larger CodecParams.clip",
                i,
                exc.value,
                exc.bound,
            ) from None

        peers = [j for j in sel if j != self.node_id]
        add_pairwise_masks(
            words, self.node_id, self._seeds, peers, round_, self.params.codec.mod_bits,
            generator=self._generator(), context=announcement,
        )
        ctx = round_context(self._fp, self.run_id, round_, {j: self._key_of(j) for j in sel})
        msg = MaskedUpdate(self.run_id, round_, self.node_id, ctx, keys, words, b"", layout)
        tag = compute_tag(self._mac_key, KIND_UPDATE, round_, msg.header_bytes(), words)
        self._last_round = round_
        self._round_selected = sel
        self._round_length = length
        self._round_announcement = bytes(announcement)
        self._round_keys = {j: self._peer_keys[j] for j in peers}
        self._revealed = None
        return dataclasses.replace(msg, tag=tag)

    def reveal_masks(self, request: RevealRequest) -> MaskReveal:
        """The signed sum of this round's pairwise masks with `request.dropped` (never a seed).

        Refuses (`RefusedError`) anything the client rules forbid: another run,
        a round other than the latest masked one, sets that do not partition
        that round's selected set, this node declared dropped, too few
        survivors, or a second, different request in the same round.
        """
        _check_message(request, RevealRequest)
        if request.run_id != self.run_id:
            raise RefusedError(f"reveal request for run {request.run_id}, this is run {self.run_id}")
        if self._last_round is None or request.round != self._last_round:
            raise RefusedError(
                f"reveal request for round {request.round}: masks are revealed only for the round of"
                f" the latest masked update ({self._last_round})"
            )
        survivors = _ids(request.survivors, "survivors")
        dropped = _ids(request.dropped, "dropped")
        if self._revealed is not None:
            if self._revealed != (survivors, dropped):
                raise RefusedError(
                    f"round {request.round}: already revealed for dropped={list(self._revealed[1])};"
                    " one dropped set per round"
                )
        if not dropped:
            raise RefusedError("reveal request with no dropped node")
        if set(survivors) & set(dropped):
            raise RefusedError("a node cannot be both survivor and dropped")
        if set(survivors) | set(dropped) != set(self._round_selected):
            raise RefusedError(
                f"survivors and dropped do not partition the selected set of round {request.round}"
            )
        if self.node_id not in survivors:
            raise RefusedError(f"node {self.node_id} replied but is declared dropped")
        if len(survivors) < self.params.min_survivors:
            raise RefusedError(
                f"{len(survivors)} survivors, fewer than min_survivors={self.params.min_survivors}"
            )
        masks = pairwise_mask_sum(
            self.node_id, {d: self._round_seed(d) for d in dropped}, dropped, request.round, self._round_length,
            self.params.codec.mod_bits, generator=self._generator(), context=self._round_announcement,
        )
        msg = MaskReveal(self.run_id, request.round, self.node_id, dropped, masks, b"")
        tag = compute_tag(self._mac_key, KIND_REVEAL, request.round, msg.header_bytes(), masks)
        self._revealed = (survivors, dropped)
        return dataclasses.replace(msg, tag=tag)

    def _round_seed(self, peer: int) -> bytes:
        """The seed the latest round was masked with: a directory since may have re-keyed or forgotten
        `peer`, and masks from its new seed would not cancel (the server would decode garbage)."""
        key = self._round_keys.get(peer)
        if key is None:  # only a state saved before privfed kept the round's keys, with the peer since forgotten
            raise RefusedError(f"node {peer}'s key of round {self._last_round} is unknown: its masks cannot be rebuilt")
        if self._peer_keys.get(peer) == key:
            return self._seeds[peer]
        return pair_seed(self._kp, key, self.run_id, self.node_id, peer)  # derived from it before: valid

    # -- persistence (the node's own storage, e.g. Flower context.state) -----
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (secret: private key). Seeds are re-derived, not stored."""
        ids = sorted(self._peer_keys)
        return {
            "run_id": self.run_id,
            "node_id": self.node_id,
            "params": self._fp,
            "private_key": self._kp.private_bytes(),
            "server_public_key": self._server_pk or b"",
            "peer_ids": np.array(ids, dtype=np.uint64),
            "peer_keys": b"".join(self._peer_keys[i] for i in ids),
            "last_round": -1 if self._last_round is None else self._last_round,
            "round_selected": np.array(self._round_selected, dtype=np.uint64),
            "round_length": self._round_length,
            "round_announcement": self._round_announcement,
            "round_keys": b"".join(self._round_keys[j] for j in sorted(self._round_keys)),
            "revealed": self._revealed is not None,
            "revealed_survivors": np.array(self._revealed[0] if self._revealed else (), dtype=np.uint64),
            "revealed_dropped": np.array(self._revealed[1] if self._revealed else (), dtype=np.uint64),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], params: SecAggParams | None = None) -> "SecAggClient":
        """Rebuild a client from `state_dict()` output (params must match)."""
        params = params if params is not None else SecAggParams()
        if bytes(state["params"]) != params.fingerprint():
            raise ValueError("state was saved under different SecAggParams")
        c = cls(int(state["run_id"]), int(state["node_id"]), params,
                KeyPair.from_private_bytes(bytes(state["private_key"])))
        server_pk = bytes(state["server_public_key"])
        if server_pk:
            ids = [int(i) for i in np.asarray(state["peer_ids"], dtype=np.uint64)]
            raw = bytes(state["peer_keys"])
            keys = {i: raw[32 * k: 32 * (k + 1)] for k, i in enumerate(ids)}
            keys[c.node_id] = c.public_key
            c.on_directory(Directory(c.run_id, server_pk, keys))
        last = int(state["last_round"])
        if last >= 0:
            c._last_round = last
            c._round_selected = tuple(int(i) for i in np.asarray(state["round_selected"], dtype=np.uint64))
            c._round_length = int(state["round_length"])
            c._round_announcement = bytes(state.get("round_announcement", b""))
            peers = [j for j in c._round_selected if j != c.node_id]
            raw = bytes(state.get("round_keys", b""))
            if len(raw) == 32 * len(peers):
                c._round_keys = {j: raw[32 * k: 32 * (k + 1)] for k, j in enumerate(peers)}
            else:  # a state saved before privfed kept the round's keys: the directory's
                c._round_keys = {j: c._peer_keys[j] for j in peers if j in c._peer_keys}
            if bool(state["revealed"]):
                c._revealed = (
                    tuple(int(i) for i in np.asarray(state["revealed_survivors"], dtype=np.uint64)),
                    tuple(int(i) for i in np.asarray(state["revealed_dropped"], dtype=np.uint64)),
                )
        return c


@dataclass
class _Round:
    round: int
    selected: tuple[int, ...]
    context: bytes
    dim: int | None
    phase: Phase = Phase.COLLECTING
    received: set[int] = field(default_factory=set)
    dropped: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    revealed: set[int] = field(default_factory=set)
    acc: np.ndarray | None = None
    reveal_acc: np.ndarray | None = None
    length: int | None = None
    metric_keys: tuple[str, ...] | None = None
    request: RevealRequest | None = None
    abort_reason: str = ""
    result: AggregateResult | None = None


class SecAggServer:
    """The server's side: enrollment directory and one round at a time (see module docstring)."""

    def __init__(self, run_id: int, params: SecAggParams | None = None, keypair: KeyPair | None = None) -> None:
        self.run_id = check_u64("run_id", run_id)
        self.params = params if params is not None else SecAggParams()
        self.codec = FixedPointCodec(self.params.codec)
        self._kp = keypair if keypair is not None else KeyPair.generate()
        self._fp = self.params.fingerprint()
        self._keys: dict[int, bytes] = {}
        self._mac_keys: dict[int, bytes] = {}
        self._r: _Round | None = None
        self._last_round: int | None = None

    # -- enrollment -------------------------------------------------------
    @property
    def public_key(self) -> bytes:
        """The server's per-run X25519 public key (clients derive their tag keys from it)."""
        return self._kp.public_bytes

    @property
    def enrolled(self) -> frozenset[int]:
        """Enrolled node ids."""
        return frozenset(self._keys)

    def enroll(self, request: EnrollRequest) -> None:
        """Record a client's public key (a re-enrollment replaces it)."""
        _check_message(request, EnrollRequest)
        if request.run_id != self.run_id:
            raise WrongRunError(f"enroll request for run {request.run_id}, this is run {self.run_id}")
        node = check_u64("node_id", request.node_id)
        pk = bytes(request.public_key)
        if len(pk) != PUBLIC_KEY_BYTES:
            raise MalformedMessageError(f"public key of node {node} must be 32 bytes, got {len(pk)}")
        try:
            mac = server_mac_key(self._kp, pk, self.run_id, node, pk, self.public_key)
        except ValueError as exc:
            raise MalformedMessageError(f"public key of node {node} is invalid: {exc}") from None
        self._keys[node] = pk
        self._mac_keys[node] = mac

    def directory(self) -> Directory:
        """The public-key directory to relay to every enrolled client."""
        return Directory(self.run_id, self.public_key, dict(self._keys))

    # -- a round ----------------------------------------------------------
    @property
    def phase(self) -> Phase:
        """The current round's phase (IDLE before the first round)."""
        return Phase.IDLE if self._r is None else self._r.phase

    @property
    def round(self) -> int | None:
        """The current round number."""
        return None if self._r is None else self._r.round

    @property
    def abort_reason(self) -> str:
        """Why the current round was aborted ('' otherwise)."""
        return "" if self._r is None else self._r.abort_reason

    def start_round(self, round: int, selected: Any, *, dim: int | None = None) -> RoundAnnouncement:
        """Begin round `round` with the selected node set; `dim` (optional) is the update length.

        Rounds strictly increase. An unfinished previous round is abandoned.
        Raises ValueError for fewer than min_survivors or more than
        codec.max_clients selected nodes, NotEnrolledError for unknown nodes.
        """
        round_ = check_u64("round", round)
        if self._last_round is not None and round_ <= self._last_round:
            raise ValueError(f"round {round_} does not follow round {self._last_round}")
        sel = _ids(selected, "selected")
        unknown = [j for j in sel if j not in self._keys]
        if unknown:
            raise NotEnrolledError(f"selected nodes {unknown} are not enrolled")
        if len(sel) < self.params.min_survivors:
            raise ValueError(
                f"{len(sel)} selected nodes, fewer than min_survivors={self.params.min_survivors}"
            )
        if len(sel) > self.params.codec.max_clients:
            raise ValueError(
                f"{len(sel)} selected nodes exceed the codec headroom max_clients="
                f"{self.params.codec.max_clients}"
            )
        if dim is not None and (not is_int(dim) or dim < 0):
            raise ValueError(f"dim must be a non-negative int, got {dim!r}")
        ctx = round_context(self._fp, self.run_id, round_, {j: self._keys[j] for j in sel})
        self._r = _Round(round=round_, selected=sel, context=ctx, dim=dim)
        self._last_round = round_
        return RoundAnnouncement(self.run_id, round_, sel)

    def _current(self, run_id: int, round_: int, what: str) -> _Round:
        if run_id != self.run_id:
            raise WrongRunError(f"{what} for run {run_id}, this is run {self.run_id}")
        r = self._r
        if r is None:
            raise ReplayError(f"{what} for round {round_}, but no round is in progress")
        if round_ != r.round:
            raise ReplayError(f"{what} for round {round_}, but the current round is {r.round}")
        return r

    def _check_words(self, vec: Any, what: str) -> np.ndarray:
        if not isinstance(vec, np.ndarray) or vec.ndim != 1 or vec.dtype != self.codec.dtype:
            raise MalformedMessageError(f"{what} must be a 1-D {self.codec.dtype} array")
        return vec

    def receive(self, msg: MaskedUpdate) -> None:
        """Validate a masked update and add it to the round's sum.

        Raises (state unchanged): WrongRunError, ReplayError (another round),
        UnexpectedSenderError (not selected), LateReplyError (sender already
        declared dropped), DuplicateError, RoundClosedError, ContextMismatchError,
        AuthenticationError. An authentic update of the wrong shape (metric
        names or length) raises MalformedMessageError and aborts the round
        (`refuse`): its sender's masks must never be revealed.
        """
        _check_message(msg, MaskedUpdate)
        r = self._current(msg.run_id, msg.round, f"masked update from node {msg.node_id}")
        node = msg.node_id
        if node not in r.selected:
            raise UnexpectedSenderError(f"node {node} is not selected in round {r.round}")
        if node in r.dropped:
            raise LateReplyError(
                f"node {node} was declared dropped in round {r.round}; its late reply is discarded"
            )
        if node in r.received:
            raise DuplicateError(f"node {node} already sent its masked update for round {r.round}")
        if r.phase is not Phase.COLLECTING:
            raise RoundClosedError(f"round {r.round} is {r.phase.value}; no more masked updates")
        if bytes(msg.context) != r.context:
            raise ContextMismatchError(
                f"node {node} masked round {r.round} for another context (parameters, selected set"
                " or public keys differ from the server's)"
            )
        words = self._check_words(msg.masked, f"masked vector of node {node}")
        if not verify_tag(self._mac_keys[node], KIND_UPDATE, msg.round, msg.header_bytes(), words, msg.tag):
            raise AuthenticationError(
                f"masked update claimed from node {node} for round {r.round} does not authenticate"
                " (replayed, relabelled or altered)"
            )
        keys = tuple(msg.metric_keys)
        problem = self._shape_problem(r, node, keys, words.shape[0])
        if problem:  # authentic, so node's vector is here: never reveal its masks (see refuse)
            self.refuse(node, problem)
            raise MalformedMessageError(problem)
        length = words.shape[0]
        # accept
        r.metric_keys = keys
        r.length = length
        if r.acc is None:
            r.acc = words.copy()
        else:
            np.add(r.acc, words, out=r.acc)
        r.received.add(node)

    @staticmethod
    def _shape_problem(r: _Round, node: int, keys: tuple[str, ...], length: int) -> str:
        if r.metric_keys is not None and keys != r.metric_keys:
            return f"node {node} sent metrics {list(keys)}, others sent {list(r.metric_keys)}"
        expected = r.length if r.length is not None else (None if r.dim is None else r.dim + 1 + len(keys))
        if expected is not None and length != expected:
            return f"masked vector of node {node} has length {length}, expected {expected}"
        if length < 1 + len(keys):
            return f"masked vector of node {node} is too short"
        return ""

    def collecting(self) -> bool:
        """Whether the current round still takes masked updates (not aborted, not past the dropout cut)."""
        return self._r is not None and self._r.phase is Phase.COLLECTING

    def pending(self) -> frozenset[int]:
        """Nodes whose reply the current phase still awaits (masked updates or reveals)."""
        r = self._r
        if r is None:
            return frozenset()
        if r.phase is Phase.COLLECTING:
            return frozenset(set(r.selected) - r.received)
        if r.phase is Phase.REVEALING:
            return frozenset(set(r.survivors) - r.revealed)
        return frozenset()

    def declare_dropped(self) -> RevealRequest | None:
        """After the timeout: drop every selected node that has not replied.

        Returns the RevealRequest to send to every survivor, or None when no
        reveal is needed: nobody dropped (result() is ready) or the round was
        aborted because fewer than min_survivors replied (result() raises
        RoundAborted). In the reveal phase it returns the same request again.
        """
        r = self._r
        if r is None:
            raise RoundNotReady("no round in progress")
        if r.phase is Phase.REVEALING:
            return r.request
        if r.phase is not Phase.COLLECTING:
            return None
        missing = tuple(sorted(set(r.selected) - r.received))
        if not missing:
            return None
        r.dropped = missing
        r.survivors = tuple(sorted(r.received))
        if len(r.survivors) < self.params.min_survivors:
            self._abort(
                r, f"{len(r.survivors)} of {len(r.selected)} selected nodes sent a masked update, fewer than"
                f" min_survivors={self.params.min_survivors}"
            )
            return None
        r.phase = Phase.REVEALING
        r.request = RevealRequest(self.run_id, r.round, r.survivors, r.dropped)
        return r.request

    def receive_reveal(self, msg: MaskReveal) -> None:
        """Validate a survivor's mask reveal and add it to the masks to remove.

        Raises the same ProtocolError family as `receive`.
        """
        _check_message(msg, MaskReveal)
        r = self._current(msg.run_id, msg.round, f"mask reveal from node {msg.node_id}")
        node = msg.node_id
        if node in r.dropped:
            raise LateReplyError(f"node {node} was declared dropped in round {r.round}")
        if node not in r.selected:
            raise UnexpectedSenderError(f"node {node} is not selected in round {r.round}")
        if r.phase is not Phase.REVEALING:
            if r.phase is Phase.COLLECTING:
                raise UnexpectedSenderError(f"no reveal was requested in round {r.round}")
            raise RoundClosedError(f"round {r.round} is {r.phase.value}; no more reveals")
        if node in r.revealed:
            raise DuplicateError(f"node {node} already revealed for round {r.round}")
        if tuple(msg.dropped) != r.dropped:
            raise ContextMismatchError(
                f"node {node} revealed masks for dropped={list(msg.dropped)}, requested {list(r.dropped)}"
            )
        words = self._check_words(msg.masks, f"mask reveal of node {node}")
        if words.shape[0] != r.length:
            raise MalformedMessageError(f"mask reveal of node {node} has length {words.shape[0]}, expected {r.length}")
        if not verify_tag(self._mac_keys[node], KIND_REVEAL, msg.round, msg.header_bytes(), words, msg.tag):
            raise AuthenticationError(f"mask reveal claimed from node {node} does not authenticate")
        if r.reveal_acc is None:
            r.reveal_acc = words.copy()
        else:
            np.add(r.reveal_acc, words, out=r.reveal_acc)
        r.revealed.add(node)

    def declare_reveal_timeout(self) -> None:
        """After the reveal timeout: abort if any survivor has not revealed."""
        r = self._r
        if r is None or r.phase is not Phase.REVEALING:
            return
        missing = sorted(set(r.survivors) - r.revealed)
        if missing:
            self._abort(r, f"survivors {missing} did not reveal their masks with the dropped nodes")

    def refuse(self, node: int, reason: str) -> None:
        """A selected node's masked vector reached the server but cannot be summed (malformed, fails
        authentication, disagrees with the others' layout): abort the round.

        Never drop such a node: the server holds its vector y, and y plus the survivors' reveals of
        their masks with it is its unmasked update. Without Bonawitz et al.'s self-masks the only safe
        outcome is no result for the round; result() raises RoundAborted.
        """
        r = self._r
        if r is not None and node in r.selected and r.phase is not Phase.DONE:
            self._abort(r, f"the masked update of node {node} arrived but cannot be used ({reason}); its "
                           "masks cannot be revealed without unmasking it")

    def abort(self, reason: str) -> None:
        """Abort the current round (e.g. the caller gives up); result() will raise RoundAborted."""
        if self._r is not None and self._r.phase is not Phase.DONE:
            self._abort(self._r, reason)

    def _abort(self, r: _Round, reason: str) -> None:
        r.phase = Phase.ABORTED
        r.abort_reason = reason
        r.acc = None
        r.reveal_acc = None

    def result(self) -> AggregateResult:
        """Decode the round: the weighted sum, total weight and metric sums over the survivors.

        Raises RoundAborted (model must stay unchanged) or RoundNotReady.
        """
        r = self._r
        if r is None:
            raise RoundNotReady("no round in progress")
        if r.phase is Phase.DONE:
            assert r.result is not None
            return r.result
        if r.phase is Phase.ABORTED:
            raise RoundAborted(f"round {r.round} aborted: {r.abort_reason}")
        if self.pending():
            waiting = "masked updates" if r.phase is Phase.COLLECTING else "reveals"
            raise RoundNotReady(f"round {r.round}: {waiting} from {sorted(self.pending())} still awaited")
        assert r.acc is not None and r.length is not None and r.metric_keys is not None
        total = r.acc
        if r.phase is Phase.REVEALING:
            assert r.reveal_acc is not None
            np.subtract(total, r.reveal_acc, out=total)
        survivors = r.survivors if r.phase is Phase.REVEALING else r.selected
        reduce_mod(total, self.params.codec.mod_bits)
        vals = self.codec.decode(total)
        d = r.length - 1 - len(r.metric_keys)
        res = AggregateResult(
            run_id=self.run_id,
            round=r.round,
            weighted_sum=vals[:d],
            total_weight=float(vals[d]),
            metrics={k: float(vals[d + 1 + i]) for i, k in enumerate(r.metric_keys)},
            survivors=tuple(survivors),
            dropped=r.dropped,
        )
        r.phase = Phase.DONE
        r.result = res
        r.acc = None
        r.reveal_acc = None
        return res
