"""The checkpoint file: JSON values, numpy arrays, torch tensors and ArrayRecords
(nested in dicts, lists, tuples and sets) in one `.npz`, written atomically
(temp file in the same folder, fsync, `os.replace`). The server's checkpoint
(server/checkpoint.py) and the nodes' update-rule snapshots (client/resume.py)
both use it. The server's checkpoint also keeps an append-only journal beside it
(JSON Lines chained by SHA-256: `append_journal`, `read_journal`), so that what
grows with the run is appended once instead of rewritten at every save."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

from common.durable import fsync_dir, naming, write_atomically


# --- flattening arrays out of JSON ------------------------------------------------


def _flatten(obj: Any, prefix: str, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(obj, ArrayRecord):
        keys = []
        for name, arr in obj.items():
            arrays[f"{prefix}/{name}"] = arr.numpy()
            keys.append(name)
        return {"__arrayrecord__": prefix, "keys": keys}
    if isinstance(obj, np.ndarray):
        arrays[prefix] = obj
        return {"__array__": prefix}
    if hasattr(obj, "detach") and hasattr(obj, "cpu") and hasattr(obj, "numpy"):  # torch tensor
        arrays[prefix] = obj.detach().cpu().numpy()
        return {"__array__": prefix, "torch": True}
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj):
            return {"__dict__": {k: _flatten(v, f"{prefix}/{k}", arrays) for k, v in obj.items()}}
        return {"__items__": [[_flatten(k, f"{prefix}/k{i}", arrays), _flatten(v, f"{prefix}/{i}", arrays)]
                              for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_flatten(v, f"{prefix}/{i}", arrays) for i, v in enumerate(obj)]}
    if isinstance(obj, (set, frozenset)):
        return {"__set__": [_flatten(v, f"{prefix}/{i}", arrays) for i, v in enumerate(sorted(obj))]}
    if isinstance(obj, list):
        return [_flatten(v, f"{prefix}/{i}", arrays) for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _unflatten(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(obj, dict):
        if "__arrayrecord__" in obj:
            p = obj["__arrayrecord__"]
            return ArrayRecord({k: Array(np.ascontiguousarray(arrays[f"{p}/{k}"])) for k in obj["keys"]})
        if "__array__" in obj:
            a = np.array(arrays[obj["__array__"]])
            if obj.get("torch"):
                import torch

                return torch.from_numpy(a)
            return a
        if "__dict__" in obj:
            return {k: _unflatten(v, arrays) for k, v in obj["__dict__"].items()}
        if "__items__" in obj:
            return {_unflatten(k, arrays): _unflatten(v, arrays) for k, v in obj["__items__"]}
        if "__tuple__" in obj:
            return tuple(_unflatten(v, arrays) for v in obj["__tuple__"])
        if "__set__" in obj:
            return set(_unflatten(v, arrays) for v in obj["__set__"])
        raise ValueError(f"unknown checkpoint node {sorted(obj)}")
    if isinstance(obj, list):
        return [_unflatten(v, arrays) for v in obj]
    return obj


# --- the file ----------------------------------------------------------------------


def save_checkpoint(path: Path, state: Mapping[str, Any]) -> Path:
    """Write `state` (JSON values, arrays, ArrayRecords) to `path` atomically."""
    arrays: dict[str, np.ndarray] = {}
    meta = _flatten(dict(state), "", arrays)
    meta_bytes = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    write_atomically(path, lambda fh: np.savez(fh, __meta__=meta_bytes, **{f"a{k}": v for k, v in arrays.items()}),
                     private=True)
    return path


# what a damaged or hostile file raises while it is read: the zip, the JSON, or a reference into the arrays
UNREADABLE = (OSError, EOFError, ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError,
              zipfile.BadZipFile, zlib.error)


class CheckpointError(RuntimeError):
    """A checkpoint (or node snapshot) exists but cannot be used: unreadable, or not this run's."""


def load_checkpoint(path: Path, what_to_do: str = "delete it") -> dict[str, Any]:
    """The state saved at `path`; CheckpointError naming the file (and `what_to_do`) when it cannot be
    read. Pickled (object) arrays are refused: a checkpoint may come from anywhere on disk."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["__meta__"].tobytes().decode())
            arrays = {k[1:]: z[k] for k in z.files if k != "__meta__"}
        return _unflatten(meta, arrays)
    except UNREADABLE as exc:
        raise CheckpointError(f"{path} is corrupted or unreadable ({type(exc).__name__}: {exc}); "
                              f"{what_to_do}") from exc


# --- the journal: append-only JSON Lines, each line chained into one SHA-256 digest ---------------

JOURNAL_START = hashlib.sha256(b"").hexdigest()  # the digest of an empty journal


def chain(digest: str, line: bytes) -> str:
    """h_r = sha256(h_{r-1} || line_r): a digest of every line so far, in order, updated in O(line)."""
    return hashlib.sha256(bytes.fromhex(digest) + line).hexdigest()


def journal_line(obj: Any) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def append_journal(path: Path, end: int, line: bytes) -> int:
    """Write `line` at byte `end` of the journal at `path` (created if missing) and fsync; returns the new
    end. What follows `end` (a line whose checkpoint never landed) is cut off first; a journal shorter
    than `end` is refused, as padding it would forge lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    with naming(path), os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+b") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < end:
            raise CheckpointError(f"checkpoint journal {path} holds {size} bytes, fewer than the {end} its "
                                  "checkpoint covers: it was cut or replaced while the run was going")
        fh.truncate(end)
        fh.seek(end)
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    if created:
        fsync_dir(path.parent)  # the checkpoint about to name this journal must not outlive it
    return end + len(line)


def read_journal(path: Path, end: int, digest: str, what_to_do: str) -> list[Any]:
    """The JSON values on the lines of the first `end` bytes of the journal at `path`, which must chain to
    `digest`; CheckpointError naming the file (and `what_to_do`) when it is missing, shorter, edited or
    not JSON Lines. Bytes after `end` (a line whose checkpoint never landed) are not read."""
    def refused(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint journal {path} {why}; {what_to_do}")

    try:
        with open(path, "rb") as fh:
            data = fh.read(end)
    except FileNotFoundError:
        raise refused("is missing (the checkpoint's results rows and privacy mirror are in it)") from None
    except OSError as exc:
        raise refused(f"cannot be read ({type(exc).__name__}: {exc})") from exc
    if len(data) < end:
        raise refused(f"holds {len(data)} bytes, fewer than the {end} its checkpoint covers")
    if data and not data.endswith(b"\n"):
        raise refused(f"does not end a line at byte {end}, where its checkpoint says it does")
    lines = [line + b"\n" for line in data[:-1].split(b"\n")] if data else []
    found = JOURNAL_START
    for line in lines:
        found = chain(found, line)
    if found != digest:
        raise refused("does not match its checkpoint's SHA-256 digest (edited, or another run's)")
    try:
        return [json.loads(line) for line in lines]
    except ValueError as exc:
        raise refused(f"is not JSON Lines ({exc})") from exc
