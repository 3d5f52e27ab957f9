"""The client side of secure aggregation: a thin Flower layer over `common/secagg`.

What a node does (the server side is `server/secagg_grid.py`; the protocol
and its rules are `common/secagg/protocol.py`):

* `query.secagg_enroll` (once per run): create a `SecAggClient` for the
  server's protocol run id, persist it in `Context.state`, reply with the
  X25519 public key and the training-set size (already public from the
  roster's `query.enroll`; the server uses the largest as the weight scale).
* `train` carrying a `secagg` ConfigRecord (the round announcement, and the
  public-key directory the first time): run the strategy's local update rule
  as usual, then reply with ONE masked vector instead of the rule's records:

      x_i = [ w_i * (A_i - A_global) for every ArrayRecord A the instruction also carries,
              1   *  B_i              for every other ArrayRecord B (flagged unit-weight by the server),
              w_i,  w_i * m_i for every metric m ]
      w_i = num-examples_i / weight-scale        (<= 1)

  encoded in fixed point mod 2^bits and masked with the pairwise PRF masks of
  the announced selected set (`SecAggClient.masked_update`). Only the
  layout (record names, array names, shapes, dtypes, metric names) travels
  in the clear, covered by the vector's tag. Records in the unit-weight list are divided by w_i before
  encoding, so that after the protocol's multiplication by w_i they enter
  with weight 1 (SCAFFOLD's control delta, FedDyn's unweighted model sum).
  Deltas, not models, are masked: they are small, so a modest codec bound B
  (`secagg-clip`) holds with a fine fixed-point step.
* A value outside the codec bound B is never wrapped: the node replies with a
  `secagg` record holding only `error` (and the server drops it for the round).
* `query.secagg_reveal` (only when someone dropped): reply with the round's
  summed masks with the dropped peers (`SecAggClient.reveal_masks`, which
  refuses anything its rules forbid).

State: `SecAggClient.state_dict()` lives in `Context.state["secagg-client"]`
(a ConfigRecord of bytes and ints; the pairwise seeds are re-derived, never
stored) and is saved before every reply, so the protocol survives Flower's
deployment runtime, where every message runs in a fresh ClientApp process.

A node whose run config has `secure-aggregation = true` refuses a `train`
message without an announcement: it never sends an unmasked update.

This module also defines the wire format shared with the server's grid
(record names, id packing, parsing): both sides import it from here.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from common.config import clients_per_round
from common.number_checks import is_real
from common.records import NUM_EXAMPLES
from common.secagg import (
    CodecParams,
    CodecRangeError,
    Directory,
    MaskedUpdate,
    MaskReveal,
    RevealRequest,
    SecAggClient,
    SecAggParams,
)
from common.secagg.keys import check_u64

# --- wire format (shared with server/secagg_grid.py) ------------------------------
RECORD = "secagg"  # ConfigRecord in every secure-aggregation message, both directions
VECTOR = "secagg-vector"  # ArrayRecord with the one array WORDS (masked vector or mask reveal)
WORDS = "words"
STATE = "secagg-client"  # ConfigRecord in Context.state
ENROLL_TYPE = "query.secagg_enroll"
REVEAL_TYPE = "query.secagg_reveal"


class SecureAggregationRefused(RuntimeError):
    """This node will not take part as asked (e.g. a train message without an announcement)."""


def u64b(value: int) -> bytes:
    """8-byte big-endian unsigned (Flower node ids use all 64 bits; ConfigRecord ints are signed)."""
    return check_u64("id", value).to_bytes(8, "big")


def as_bytes(raw: Any, what: str = "field") -> bytes:
    """A bytes field of a received record. Not bytes(raw): bytes(2**40) would allocate 2**40 zero bytes."""
    if not isinstance(raw, bytes):
        raise ValueError(f"{what} must be bytes, got {type(raw).__name__}")
    return raw


def from_u64b(raw: Any) -> int:
    raw = as_bytes(raw, "a u64")
    if len(raw) != 8:
        raise ValueError(f"expected 8 bytes for a u64, got {len(raw)}")
    return int.from_bytes(raw, "big")


def ids_bytes(ids) -> bytes:
    return b"".join(u64b(i) for i in ids)


def ids_from_bytes(raw: Any) -> tuple[int, ...]:
    raw = as_bytes(raw, "an id list")
    if len(raw) % 8:
        raise ValueError("id list length is not a multiple of 8")
    return tuple(int.from_bytes(raw[k:k + 8], "big") for k in range(0, len(raw), 8))


def secagg_params(config: Mapping[str, Any]) -> SecAggParams:
    """The protocol parameters both sides derive from the run config.

    Codec: modulus 2^secagg-bits, bound B = secagg-clip, headroom for the
    clients a round selects (`clients_per_round`; both sides refuse a larger
    set), and the finest scale 2^f that fits (`CodecParams.fit`): 32 bits,
    B = 1024, 10 clients per round gives f = 17 (step 7.6e-6); 64 bits gives
    f = 49.
    """
    per_round = clients_per_round(int(config["num-clients"]), float(config["fraction-train"]))
    codec = CodecParams.fit(int(config["secagg-bits"]), float(config["secagg-clip"]), per_round)
    return SecAggParams(codec=codec, min_survivors=int(config["secagg-min-survivors"]))


def directory_digest(directory: Directory) -> bytes:
    """SHA-256 of the directory (server key, sorted ids and keys): announced every round."""
    h = hashlib.sha256(b"privfed/secagg/v1/directory")
    h.update(bytes(directory.server_public_key))
    for node in sorted(directory.public_keys):
        h.update(u64b(node) + bytes(directory.public_keys[node]))
    return h.digest()


def announcement_digest(cfg: Mapping[str, Any]) -> bytes:
    """SHA-256 of what the server announces to every selected node alike (run, round, selected set, weight
    scale, unit-weight records, directory digest). The round's masks are bound to it, so they cancel only
    between nodes told the same: a server that tells one node another weight scale decodes noise."""
    h = hashlib.sha256(b"privfed/secagg/v1/announcement")
    for key in ("run", "round", "selected", "directory-digest"):
        value = as_bytes(cfg[key], key)
        h.update(u64b(len(value)) + value)
    scale = float(cfg["weight-scale"]).hex().encode()
    units = str(cfg.get("unit-records", "")).encode()
    h.update(u64b(len(scale)) + scale + u64b(len(units)) + units)
    return h.digest()


def directory_fields(directory: Directory) -> dict[str, bytes]:
    ids = sorted(directory.public_keys)
    return {"server-key": bytes(directory.server_public_key), "directory-nodes": ids_bytes(ids),
            "directory-keys": b"".join(bytes(directory.public_keys[i]) for i in ids)}


def directory_from_fields(run_id: int, cfg: Mapping[str, Any]) -> Directory:
    ids = ids_from_bytes(cfg["directory-nodes"])
    raw = as_bytes(cfg["directory-keys"], "directory-keys")
    if len(raw) != 32 * len(ids):
        raise ValueError("directory keys do not match its node ids")
    return Directory(run_id, as_bytes(cfg["server-key"], "server-key"),
                     {i: raw[32 * k:32 * (k + 1)] for k, i in enumerate(ids)})


def words_record(words: np.ndarray) -> ArrayRecord:
    return ArrayRecord(OrderedDict([(WORDS, Array(np.ascontiguousarray(words)))]))


def masked_update_to_content(mu: MaskedUpdate) -> RecordDict:
    cfg = ConfigRecord({"run": u64b(mu.run_id), "round": u64b(mu.round), "node": u64b(mu.node_id),
                        "context": bytes(mu.context), "metric-keys": json.dumps(list(mu.metric_keys)),
                        "tag": bytes(mu.tag), "layout": mu.layout})
    return RecordDict({RECORD: cfg, VECTOR: words_record(mu.masked)})


def masked_update_from_content(content: RecordDict) -> MaskedUpdate:
    """Parse a masked reply (KeyError / ValueError / TypeError on anything malformed)."""
    cfg = content[RECORD]
    words = content[VECTOR][WORDS].numpy()
    keys = json.loads(str(cfg["metric-keys"]))
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("metric-keys must be a list of strings")
    mu = MaskedUpdate(from_u64b(cfg["run"]), from_u64b(cfg["round"]), from_u64b(cfg["node"]),
                      as_bytes(cfg["context"], "context"), tuple(keys), words, as_bytes(cfg["tag"], "tag"),
                      str(cfg["layout"]))
    return mu


def reveal_request_to_content(req: RevealRequest) -> RecordDict:
    return RecordDict({RECORD: ConfigRecord({"run": u64b(req.run_id), "round": u64b(req.round),
                                             "survivors": ids_bytes(req.survivors),
                                             "dropped": ids_bytes(req.dropped)})})


def mask_reveal_to_content(rev: MaskReveal) -> RecordDict:
    cfg = ConfigRecord({"run": u64b(rev.run_id), "round": u64b(rev.round), "node": u64b(rev.node_id),
                        "dropped": ids_bytes(rev.dropped), "tag": bytes(rev.tag)})
    return RecordDict({RECORD: cfg, VECTOR: words_record(rev.masks)})


def mask_reveal_from_content(content: RecordDict) -> MaskReveal:
    cfg = content[RECORD]
    return MaskReveal(from_u64b(cfg["run"]), from_u64b(cfg["round"]), from_u64b(cfg["node"]),
                      ids_from_bytes(cfg["dropped"]), content[VECTOR][WORDS].numpy(), as_bytes(cfg["tag"], "tag"))


def failure_content(reason: str) -> RecordDict:
    return RecordDict({RECORD: ConfigRecord({"error": reason[:2000]})})


# --- layout of the masked vector ----------------------------------------------------
def record_layout(name: str, record: ArrayRecord, *, delta: bool, unit: bool) -> dict[str, Any]:
    return {"name": name, "delta": delta, "unit": unit,
            "arrays": [[k, a.numpy().dtype.str, list(a.numpy().shape)] for k, a in record.items()]}


def same_structure(a: ArrayRecord, b: ArrayRecord) -> bool:
    if list(a.keys()) != list(b.keys()):
        return False
    return all(tuple(a[k].numpy().shape) == tuple(b[k].numpy().shape) for k in a.keys())


def flatten(record: ArrayRecord, minus: ArrayRecord | None = None) -> np.ndarray:
    """All arrays of `record` as one float64 vector (record order); minus `minus`'s when given (one pass)."""
    arrays = [a.numpy() for a in record.values()]
    out = np.empty(sum(a.size for a in arrays), dtype=np.float64)
    subtract = [b.numpy() for b in minus.values()] if minus is not None else [None] * len(arrays)
    offset = 0
    for a, b in zip(arrays, subtract):
        seg = out[offset:offset + a.size]
        if b is None:
            seg[:] = a.ravel()
        else:
            np.subtract(a.ravel(), b.ravel(), out=seg, dtype=np.float64)
        offset += a.size
    return out


def unflatten(vector: np.ndarray, arrays_layout: list) -> ArrayRecord:
    """Inverse of `flatten` for a layout's [[name, dtype, shape], ...] (integer dtypes are rounded)."""
    out, offset = OrderedDict(), 0
    for key, dtype, shape in arrays_layout:
        size = array_size(shape)
        seg = vector[offset:offset + size]
        offset += size
        dt = np.dtype(dtype)
        if dt.kind in "iub":
            seg = np.rint(seg)
        out[key] = Array(np.asarray(seg, dtype=dt).reshape(shape))
    if offset != len(vector):
        raise ValueError(f"layout covers {offset} values, the vector has {len(vector)}")
    return ArrayRecord(out)


def array_size(shape) -> int:
    """Exact element count (Python ints: np.prod in int64 wraps, e.g. [2**32, 2**32] -> 0)."""
    return math.prod(int(s) for s in shape)


def layout_size(layout: Mapping[str, Any]) -> int:
    return sum(array_size(shape) for rec in layout["records"] for _, _, shape in rec["arrays"])


def encode_reply(reply: RecordDict, instruction: RecordDict, unit_records: set[str], weight_scale: float,
                 codec_scale: float) -> tuple[np.ndarray, float, dict[str, float], str]:
    """(vector, weight w_i, weighted metrics, layout JSON) of a rule's reply (see module docstring). w_i is on
    the codec's grid (`codec_scale` = 2^frac_bits), as `masked_update` multiplies by it: a unit-weight record
    divided by it then enters the sum exactly once (divided by the unrounded w_i, a small client's was off
    by up to 2^-(frac_bits+1) / w_i of itself)."""
    metric_records = [(k, r) for k, r in reply.items() if isinstance(r, MetricRecord)]
    if len(metric_records) != 1:
        raise ValueError(f"a reply needs exactly one MetricRecord under secure aggregation, got {len(metric_records)}")
    metric_name, metrics = metric_records[0]
    n = metrics.get(NUM_EXAMPLES)
    if not is_real(n) or not math.isfinite(n) or n < 0:
        raise ValueError(f"{NUM_EXAMPLES!r} must be a non-negative number, got {n!r}")
    if not weight_scale > 0:
        raise ValueError(f"weight scale must be positive, got {weight_scale!r}")
    w = float(np.rint(float(n) / float(weight_scale) * codec_scale) / codec_scale)
    parts, records = [], []
    for name, record in reply.items():
        if not isinstance(record, ArrayRecord):
            continue
        ref = instruction.get(name)
        delta = isinstance(ref, ArrayRecord) and same_structure(record, ref)
        unit = name in unit_records
        vec = flatten(record, ref if delta else None)
        if unit:
            if w <= 0:
                raise ValueError(f"record {name!r} is unit-weight but this client's weight is 0 (on the codec's "
                                 f"grid: {n} examples of the largest client's {weight_scale:g})")
            vec = vec / w
        parts.append(vec)
        records.append(record_layout(name, record, delta=delta, unit=unit))
    if not records:
        raise ValueError("the reply has no ArrayRecord to aggregate")
    weighted = {}
    for key, value in metrics.items():
        if key == NUM_EXAMPLES:
            continue
        if not is_real(value):
            raise ValueError(f"metric {key!r} is not a number ({type(value).__name__}); only scalar metrics "
                             "can be aggregated securely")
        weighted[str(key)] = w * float(value)
    layout = json.dumps({"records": records, "metric-record": metric_name}, separators=(",", ":"))
    return np.concatenate(parts), w, weighted, layout


# --- node state -------------------------------------------------------------------
def _save(context: Context, sa: SecAggClient, digest: bytes) -> None:
    s = sa.state_dict()
    context.state[STATE] = ConfigRecord({
        "run": u64b(s["run_id"]), "node": u64b(s["node_id"]), "params": bytes(s["params"]),
        "private-key": bytes(s["private_key"]), "server-key": bytes(s["server_public_key"]),
        "peer-ids": ids_bytes(int(i) for i in s["peer_ids"]), "peer-keys": bytes(s["peer_keys"]),
        "last-round": int(s["last_round"]), "round-selected": ids_bytes(int(i) for i in s["round_selected"]),
        "round-length": int(s["round_length"]), "round-announcement": bytes(s["round_announcement"]),
        "revealed": bool(s["revealed"]),
        "revealed-survivors": ids_bytes(int(i) for i in s["revealed_survivors"]),
        "revealed-dropped": ids_bytes(int(i) for i in s["revealed_dropped"]),
        "directory-digest": digest,
    })


def _load(context: Context, params: SecAggParams) -> tuple[SecAggClient, bytes]:
    if STATE not in context.state:
        raise SecureAggregationRefused("this node is not enrolled in secure aggregation for this run")
    c = context.state[STATE]
    ids = lambda key: np.array(ids_from_bytes(c[key]), dtype=np.uint64)  # noqa: E731
    state = {
        "run_id": from_u64b(c["run"]), "node_id": from_u64b(c["node"]), "params": bytes(c["params"]),
        "private_key": bytes(c["private-key"]), "server_public_key": bytes(c["server-key"]),
        "peer_ids": ids("peer-ids"), "peer_keys": bytes(c["peer-keys"]), "last_round": int(c["last-round"]),
        "round_selected": ids("round-selected"), "round_length": int(c["round-length"]),
        "round_announcement": bytes(c["round-announcement"]) if "round-announcement" in c else b"",
        "revealed": bool(c["revealed"]), "revealed_survivors": ids("revealed-survivors"),
        "revealed_dropped": ids("revealed-dropped"),
    }
    return SecAggClient.from_state_dict(state, params), bytes(c["directory-digest"])


# --- handlers -----------------------------------------------------------------------
def handle_enroll(msg: Message, context: Context, config: Mapping[str, Any], num_examples: int) -> Message:
    """`query.secagg_enroll`: a fresh key pair for the announced protocol run."""
    params = secagg_params(config)
    cfg = msg.content[RECORD]
    run_id = from_u64b(cfg["run"])
    if as_bytes(cfg["params"], "params") != params.fingerprint():
        raise SecureAggregationRefused(
            "the server's secure-aggregation parameters differ from this node's run config "
            "(secagg-bits, secagg-clip, secagg-min-survivors, num-clients)")
    node = int(context.node_id)
    if STATE in context.state:
        sa, digest = _load(context, params)
        if sa.run_id != run_id:  # a new protocol run: new keys
            sa, digest = SecAggClient(run_id, node, params), b""
    else:
        sa, digest = SecAggClient(run_id, node, params), b""
    _save(context, sa, digest)
    req = sa.enroll_request()
    reply = ConfigRecord({"run": u64b(req.run_id), "node": u64b(req.node_id), "public-key": bytes(req.public_key),
                          "num-examples": int(num_examples)})
    return Message(RecordDict({RECORD: reply}), reply_to=msg)


def is_secure(msg: Message) -> bool:
    return msg.has_content() and RECORD in msg.content


Rule = Callable[[Any, RecordDict, RecordDict], RecordDict]


def secure_train(rule: Rule, client: Any, msg: Message, context: Context) -> Message:
    """A `train` message under secure aggregation: run `rule`, reply with the masked vector."""
    if not is_secure(msg):
        raise SecureAggregationRefused(
            "this run has secure-aggregation = true but the train message carries no round announcement: "
            "refusing to send an unmasked update")
    params = secagg_params(client.config)
    sa, digest = _load(context, params)
    cfg = msg.content[RECORD]
    run_id = from_u64b(cfg["run"])
    if run_id != sa.run_id:
        raise SecureAggregationRefused(f"announcement for protocol run {run_id}, this node enrolled in {sa.run_id}")
    if "server-key" in cfg:
        directory = directory_from_fields(run_id, cfg)
        sa.on_directory(directory)
        digest = directory_digest(directory)
        _save(context, sa, digest)
    if digest != as_bytes(cfg["directory-digest"], "directory-digest"):
        raise SecureAggregationRefused("the announced key directory differs from the one this node holds")
    round_ = from_u64b(cfg["round"])
    selected = ids_from_bytes(cfg["selected"])
    unit = {s for s in str(cfg.get("unit-records", "")).split(",") if s}
    sa.check_round(round_, selected)  # refuse before training: a refused round must spend no privacy budget
    scale = float(cfg["weight-scale"])
    if not (math.isfinite(scale) and scale > 0):  # encode_reply would refuse it only after training
        raise SecureAggregationRefused(f"the announced weight scale {scale!r} is not a finite positive number")
    announcement = announcement_digest(cfg)
    instruction = msg.content
    reply = rule(client, instruction, context.state)
    try:
        vector, weight, metrics, layout = encode_reply(reply, instruction, unit, scale, params.codec.scale)
        masked = sa.masked_update(round_, selected, vector, weight, metrics, layout=layout,
                                  announcement=announcement)
    except CodecRangeError:  # its message quotes the offending value: unmasked data, it stays here
        bound = params.codec.clip
        return Message(failure_content(f"a value is outside the secure-aggregation codec range [-{bound:g}, "
                                       f"{bound:g}] (secagg-clip)"), reply_to=msg)
    except ValueError as exc:
        return Message(failure_content(f"cannot encode the reply for secure aggregation: {exc}"), reply_to=msg)
    _save(context, sa, digest)  # the round's masks are used: persist before the vector leaves
    return Message(masked_update_to_content(masked), reply_to=msg)


def handle_reveal(msg: Message, context: Context, config: Mapping[str, Any]) -> Message:
    """`query.secagg_reveal`: this round's summed masks with the dropped peers (or a refusal)."""
    params = secagg_params(config)
    sa, digest = _load(context, params)
    cfg = msg.content[RECORD]
    req = RevealRequest(from_u64b(cfg["run"]), from_u64b(cfg["round"]), ids_from_bytes(cfg["survivors"]),
                        ids_from_bytes(cfg["dropped"]))
    reveal = sa.reveal_masks(req)  # raises RefusedError for anything the client rules forbid
    _save(context, sa, digest)
    return Message(mask_reveal_to_content(reveal), reply_to=msg)
