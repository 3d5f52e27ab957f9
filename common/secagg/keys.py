"""Key agreement: X25519 key pairs and HKDF-SHA256 pairwise seeds.

Every participant (each client and the server) holds one X25519 key pair per
run. Public keys are 32 raw bytes. Two clients i and j derive the *same*
32-byte pairwise seed

    seed_ij = HKDF-SHA256(ikm  = X25519(sk_i, pk_j)          (= X25519(sk_j, pk_i)),
                          salt = "privfed/secagg/v1/pair" || u64(run_id),
                          info = "pair-seed" || u64(lo) || u64(hi) || pk_lo || pk_hi,
                          length = 32)

with (lo, hi) = (min(i, j), max(i, j)) and pk_lo, pk_hi their public keys. The
pair is *ordered* inside the derivation, so both sides get the same bytes, and
the transcript (run, both ids, both keys) is bound: a seed from another run,
another pair, or another key of the same node never coincides. One symmetric
seed per pair is enough because the mask sign is set by node-id order
(`masking.py`): i adds +G(seed_ij, t), j adds -G(seed_ij, t). This settles the
"ordered seeds" point that the paper leaves open (zcdp-secagg.md, item 6).

The same construction gives each client a key shared with the server
(`server_mac_key`), used only to authenticate the client's messages
(`auth.py`). The server knows that key; it is not secret from the server and
is never used for masking.

Ids: node ids are Flower node ids (unsigned 64-bit ints), run ids likewise.
They are encoded as 8-byte big-endian unsigned integers; anything outside
[0, 2^64) is a `ValueError`.

Limitations (documented, not solved here): public keys are relayed by the
server without a PKI, so an actively malicious server could substitute keys
(man in the middle). The paper's threat model is an honest-but-curious server;
Flower's node authentication could sign public keys later.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "KeyPair",
    "SEED_BYTES",
    "PUBLIC_KEY_BYTES",
    "check_u64",
    "u64",
    "pair_seed",
    "server_mac_key",
]

SEED_BYTES = 32
PUBLIC_KEY_BYTES = 32
_U64_LIMIT = 1 << 64
_PAIR_SALT = b"privfed/secagg/v1/pair"
_MAC_SALT = b"privfed/secagg/v1/mac"


def check_u64(name: str, value: object) -> int:
    """Return `value` as a Python int in [0, 2^64), or raise ValueError/TypeError."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        v = operator.index(value)  # int, numpy integer
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if not 0 <= v < _U64_LIMIT:
        raise ValueError(f"{name}={v} is outside [0, 2^64)")
    return v


def u64(value: int) -> bytes:
    """8-byte big-endian encoding of an unsigned 64-bit int."""
    return int(value).to_bytes(8, "big")


@dataclass(frozen=True, eq=False)
class KeyPair:
    """An X25519 key pair. `public_bytes` is what goes on the wire."""

    private_key: X25519PrivateKey

    @classmethod
    def generate(cls) -> "KeyPair":
        """A fresh key pair from the OS CSPRNG."""
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> "KeyPair":
        """Rebuild from the 32 raw private bytes (for state persisted on the node)."""
        return cls(X25519PrivateKey.from_private_bytes(bytes(raw)))

    @property
    def public_bytes(self) -> bytes:
        """The 32 raw public-key bytes."""
        return self.private_key.public_key().public_bytes_raw()

    def private_bytes(self) -> bytes:
        """The 32 raw private bytes. Secret: only for local persistence."""
        return self.private_key.private_bytes_raw()

    def exchange(self, peer_public: bytes) -> bytes:
        """X25519 shared secret with `peer_public` (32 raw bytes).

        Raises ValueError for malformed or low-order public keys (all-zero
        shared secret), as `cryptography` does.
        """
        if len(peer_public) != PUBLIC_KEY_BYTES:
            raise ValueError(
                f"public key must be {PUBLIC_KEY_BYTES} bytes, got {len(peer_public)}"
            )
        return self.private_key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=salt, info=info).derive(ikm)


def pair_seed(
    keypair: KeyPair | X25519PrivateKey,
    peer_public: bytes,
    run_id: int,
    my_id: int,
    peer_id: int,
) -> bytes:
    """The 32-byte pairwise seed of (my_id, peer_id) in `run_id`; both sides get the same bytes."""
    kp = keypair if isinstance(keypair, KeyPair) else KeyPair(keypair)
    run_id = check_u64("run_id", run_id)
    my_id = check_u64("my_id", my_id)
    peer_id = check_u64("peer_id", peer_id)
    if my_id == peer_id:
        raise ValueError(f"no pairwise seed with oneself (node {my_id})")
    my_pk = kp.public_bytes
    peer_public = bytes(peer_public)
    shared = kp.exchange(peer_public)
    if my_id < peer_id:
        lo, hi, pk_lo, pk_hi = my_id, peer_id, my_pk, peer_public
    else:
        lo, hi, pk_lo, pk_hi = peer_id, my_id, peer_public, my_pk
    info = b"pair-seed" + u64(lo) + u64(hi) + pk_lo + pk_hi
    return _hkdf(shared, _PAIR_SALT + u64(run_id), info)


def server_mac_key(
    keypair: KeyPair,
    peer_public: bytes,
    run_id: int,
    client_id: int,
    client_public: bytes,
    server_public: bytes,
) -> bytes:
    """The 32-byte key shared by one client and the server for message tags.

    Called by the client with (its key pair, the server's public key) and by
    the server with (its key pair, the client's public key); both get the same
    bytes.
    """
    run_id = check_u64("run_id", run_id)
    client_id = check_u64("client_id", client_id)
    shared = keypair.exchange(peer_public)
    info = b"client-server-mac" + u64(client_id) + bytes(client_public) + bytes(server_public)
    return _hkdf(shared, _MAC_SALT + u64(run_id), info)
