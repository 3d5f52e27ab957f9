"""Secure aggregation for privfed: pairwise PRF masks agreed once per run (pure, no Flower).

Modules (each documents its parameters and choices):

* `keys`      X25519 key pairs; HKDF-SHA256 pairwise seeds bound to the run and
              the ordered pair; the client-server tag key.
* `prf`       G(seed, round): AES-256-CTR keystream as uint32/uint64 words mod 2^k,
              round and a domain tag in the nonce.
* `codec`     fixed point: scale 2^f, clip bound B, modulus 2^k with headroom
              n_max * round(B 2^f) < 2^(k-1); out-of-range values raise.
* `masking`   sign(i, j) = +1 if i < j else -1; add / remove / sum pairwise masks.
* `auth`      Poly1305 tags binding a vector to run, round, sender and context.
* `messages`  the protocol's message dataclasses (to_dict / from_dict).
* `protocol`  `SecAggClient` and `SecAggServer` state machines: enrollment, one
              round trip per round, dropout recovery by mask reveal, abort rules.
* `errors`    the exception hierarchy.
"""

from .codec import CodecParams, CodecRangeError, FixedPointCodec
from .errors import (
    AuthenticationError,
    ContextMismatchError,
    DuplicateError,
    LateReplyError,
    MalformedMessageError,
    NotEnrolledError,
    ProtocolError,
    RefusedError,
    ReplayError,
    RoundAborted,
    RoundClosedError,
    RoundNotReady,
    SecAggError,
    UnexpectedSenderError,
    WrongRunError,
)
from .keys import KeyPair, pair_seed
from .masking import add_pairwise_masks, mask_sign, pairwise_mask_sum
from .messages import (
    Directory,
    EnrollRequest,
    MaskedUpdate,
    MaskReveal,
    RevealRequest,
    RoundAnnouncement,
)
from .prf import MaskGenerator, mask_vector
from .protocol import AggregateResult, Phase, SecAggClient, SecAggParams, SecAggServer

__all__ = [
    "AggregateResult",
    "AuthenticationError",
    "CodecParams",
    "CodecRangeError",
    "ContextMismatchError",
    "Directory",
    "DuplicateError",
    "EnrollRequest",
    "FixedPointCodec",
    "KeyPair",
    "LateReplyError",
    "MalformedMessageError",
    "MaskGenerator",
    "MaskReveal",
    "MaskedUpdate",
    "NotEnrolledError",
    "Phase",
    "ProtocolError",
    "RefusedError",
    "ReplayError",
    "RevealRequest",
    "RoundAborted",
    "RoundAnnouncement",
    "RoundClosedError",
    "RoundNotReady",
    "SecAggClient",
    "SecAggError",
    "SecAggParams",
    "SecAggServer",
    "UnexpectedSenderError",
    "WrongRunError",
    "add_pairwise_masks",
    "mask_sign",
    "mask_vector",
    "pair_seed",
    "pairwise_mask_sum",
]
