"""The protocol's messages: small frozen dataclasses, convertible to plain dicts.

Direction and content (no message ever carries a seed, a private key or an
unmasked value):

    client -> server  EnrollRequest     run_id, node_id, public_key (32 B)
    server -> client  Directory         run_id, server_public_key, {node_id: public_key}
    server -> client  RoundAnnouncement run_id, round, selected ids
    client -> server  MaskedUpdate      run_id, round, node_id, context (32 B), metric
                                        names, masked words (uint32/uint64), tag (16 B),
                                        layout (what the words mean; a caller's string)
    server -> client  RevealRequest     run_id, round, survivors, dropped
    client -> server  MaskReveal        run_id, round, node_id, dropped, signed sum of
                                        the round's pairwise masks with the dropped
                                        peers (words), tag (16 B)

`to_dict()` gives a dict of Python ints, str, bytes, lists of str and numpy
arrays (id sets as uint64 arrays, since Flower node ids use all 64 bits);
`from_dict()` inverts it. The Flower record conversion belongs to
`common/records.py`; note that Flower's ConfigRecord ints are signed 64-bit,
so ids >= 2^63 must travel as uint64 arrays or bytes there.

`header_bytes()` is the canonical encoding of every field except the tag and
the vector's contents; it is what the tag authenticates (with the vector).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from common.number_checks import is_int
from .auth import KIND_REVEAL, KIND_UPDATE
from .keys import check_u64, u64

__all__ = [
    "EnrollRequest",
    "Directory",
    "RoundAnnouncement",
    "MaskedUpdate",
    "RevealRequest",
    "MaskReveal",
    "round_context",
    "ids_array",
]


def _ids(values: Any, name: str) -> tuple[int, ...]:
    """Sorted tuple of distinct u64 ids."""
    arr = list(values)
    ids = tuple(sorted(check_u64(name, v) for v in arr))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name} contains duplicate node ids")
    return ids


_FIELD_KINDS: dict[str, tuple[str, Any]] = {  # each message field: (what it must be, the check)
    **{name: ("an int", is_int) for name in ("run_id", "round", "node_id")},
    **{name: ("bytes", lambda v: isinstance(v, bytes))
       for name in ("public_key", "server_public_key", "context", "tag")},
    **{name: ("a tuple of ints", lambda v: isinstance(v, tuple) and all(map(is_int, v)))
       for name in ("selected", "survivors", "dropped")},
    "public_keys": ("a mapping of ints to bytes",
                    lambda v: isinstance(v, Mapping) and all(is_int(k) and isinstance(b, bytes) for k, b in v.items())),
    "metric_keys": ("a tuple of str", lambda v: isinstance(v, tuple) and all(isinstance(k, str) for k in v)),
    "layout": ("a str", lambda v: isinstance(v, str)),
    **{name: ("a numpy array", lambda v: isinstance(v, np.ndarray)) for name in ("masked", "masks")},
}


def field_problem(msg: Any) -> str | None:
    """Which field of a message has the wrong type (a hand-built or hostile one; `from_dict` converts):
    checked before anything reads it, so that it is a MalformedMessageError, not a TypeError deep inside."""
    for f in fields(msg):
        what, ok = _FIELD_KINDS[f.name]
        if not ok(getattr(msg, f.name)):
            return f"{type(msg).__name__}.{f.name} must be {what}, got {type(getattr(msg, f.name)).__name__}"
    return None


def ids_array(ids: tuple[int, ...]) -> np.ndarray:
    """uint64 numpy array of node ids (for dict/record transport)."""
    return np.array(ids, dtype=np.uint64)


def _pack_ids(ids: tuple[int, ...]) -> bytes:
    return struct.pack(">I", len(ids)) + b"".join(u64(i) for i in ids)


def _pack_strs(strs: tuple[str, ...]) -> bytes:
    out = [struct.pack(">I", len(strs))]
    for s in strs:
        b = s.encode("utf-8")
        out.append(struct.pack(">I", len(b)) + b)
    return b"".join(out)


def _vec_desc(v: np.ndarray) -> bytes:
    return v.dtype.str.encode("ascii").ljust(4, b" ") + u64(v.shape[0] if v.ndim == 1 else 0)


def round_context(
    params_fingerprint: bytes, run_id: int, round_: int, selected_keys: Mapping[int, bytes]
) -> bytes:
    """SHA-256 digest of (params, run, round, sorted selected ids and their public keys).

    Client and server compute it independently; a masked update whose context
    differs from the server's (other parameters, node set, or a stale public
    key) could not cancel and is rejected with `ContextMismatchError`.
    """
    h = hashlib.sha256(b"privfed/secagg/v1/round-context")
    h.update(params_fingerprint)
    h.update(u64(run_id) + u64(round_) + struct.pack(">I", len(selected_keys)))
    for node in sorted(selected_keys):
        h.update(u64(node) + bytes(selected_keys[node]))
    return h.digest()


@dataclass(frozen=True)
class EnrollRequest:
    """client -> server: the client's public key for this run."""

    run_id: int
    node_id: int
    public_key: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "enroll", "run_id": self.run_id, "node_id": self.node_id,
                "public_key": bytes(self.public_key)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EnrollRequest":
        return cls(int(d["run_id"]), int(d["node_id"]), bytes(d["public_key"]))


@dataclass(frozen=True)
class Directory:
    """server -> clients: every enrolled node's public key and the server's key."""

    run_id: int
    server_public_key: bytes
    public_keys: Mapping[int, bytes] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        ids = tuple(sorted(self.public_keys))
        return {
            "kind": "directory",
            "run_id": self.run_id,
            "server_public_key": bytes(self.server_public_key),
            "node_ids": ids_array(ids),
            "public_keys": b"".join(bytes(self.public_keys[i]) for i in ids),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Directory":
        ids = [int(i) for i in np.asarray(d["node_ids"], dtype=np.uint64)]
        raw = bytes(d["public_keys"])
        if len(raw) != 32 * len(ids):
            raise ValueError("directory: public_keys length does not match node_ids")
        keys = {i: raw[32 * k: 32 * (k + 1)] for k, i in enumerate(ids)}
        return cls(int(d["run_id"]), bytes(d["server_public_key"]), keys)


@dataclass(frozen=True)
class RoundAnnouncement:
    """server -> selected clients: the round number and the selected set."""

    run_id: int
    round: int
    selected: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "announce", "run_id": self.run_id, "round": self.round,
                "selected": ids_array(self.selected)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RoundAnnouncement":
        return cls(int(d["run_id"]), int(d["round"]),
                   _ids(np.asarray(d["selected"], dtype=np.uint64).tolist(), "selected"))


@dataclass(frozen=True)
class MaskedUpdate:
    """client -> server: encode([w*u, w, metrics]) + pairwise masks, mod 2^k."""

    run_id: int
    round: int
    node_id: int
    context: bytes
    metric_keys: tuple[str, ...]
    masked: np.ndarray
    tag: bytes
    layout: str = ""  # what the vector's entries mean (the caller's format); authenticated with it

    def header_bytes(self) -> bytes:
        return (KIND_UPDATE + u64(self.run_id) + u64(self.round) + u64(self.node_id)
                + bytes(self.context) + _pack_strs(self.metric_keys) + _pack_strs((self.layout,))
                + _vec_desc(self.masked))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "masked-update", "run_id": self.run_id, "round": self.round,
                "node_id": self.node_id, "context": bytes(self.context),
                "metric_keys": list(self.metric_keys), "masked": self.masked,
                "tag": bytes(self.tag), "layout": self.layout}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MaskedUpdate":
        return cls(int(d["run_id"]), int(d["round"]), int(d["node_id"]), bytes(d["context"]),
                   tuple(str(k) for k in d["metric_keys"]), np.asarray(d["masked"]),
                   bytes(d["tag"]), str(d.get("layout", "")))


@dataclass(frozen=True)
class RevealRequest:
    """server -> survivors: remove your round masks with `dropped`."""

    run_id: int
    round: int
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "reveal-request", "run_id": self.run_id, "round": self.round,
                "survivors": ids_array(self.survivors), "dropped": ids_array(self.dropped)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RevealRequest":
        return cls(int(d["run_id"]), int(d["round"]),
                   _ids(np.asarray(d["survivors"], dtype=np.uint64).tolist(), "survivors"),
                   _ids(np.asarray(d["dropped"], dtype=np.uint64).tolist(), "dropped"))


@dataclass(frozen=True)
class MaskReveal:
    """survivor -> server: sum_{d in dropped} sign(me, d) * G(seed_{me,d}, round) mod 2^k."""

    run_id: int
    round: int
    node_id: int
    dropped: tuple[int, ...]
    masks: np.ndarray
    tag: bytes

    def header_bytes(self) -> bytes:
        return (KIND_REVEAL + u64(self.run_id) + u64(self.round) + u64(self.node_id)
                + _pack_ids(self.dropped) + _vec_desc(self.masks))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "mask-reveal", "run_id": self.run_id, "round": self.round,
                "node_id": self.node_id, "dropped": ids_array(self.dropped),
                "masks": self.masks, "tag": bytes(self.tag)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MaskReveal":
        return cls(int(d["run_id"]), int(d["round"]), int(d["node_id"]),
                   _ids(np.asarray(d["dropped"], dtype=np.uint64).tolist(), "dropped"),
                   np.asarray(d["masks"]), bytes(d["tag"]))
