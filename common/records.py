"""The only place that converts between tensors and Flower records.

Models travel as an `ArrayRecord` of their `state_dict` (key order kept), so a
reply's arrays map back onto the same module by name.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
NUM_EXAMPLES = "num-examples"


def model_to_arrays(model: torch.nn.Module) -> ArrayRecord:
    return ArrayRecord(OrderedDict((k, v.detach().cpu()) for k, v in model.state_dict().items()))


def arrays_to_state_dict(arrays: ArrayRecord) -> "OrderedDict[str, torch.Tensor]":
    return OrderedDict((k, torch.from_numpy(np.array(a.numpy(), copy=True))) for k, a in arrays.items())


def load_arrays(model: torch.nn.Module, arrays: ArrayRecord) -> None:
    """Copy `arrays` into `model`; raise ValueError on a missing, extra or misshapen entry."""
    model.load_state_dict(fitting_state(model, arrays))


def fitting_state(model: torch.nn.Module, arrays: ArrayRecord) -> "OrderedDict[str, torch.Tensor]":
    """`arrays` as a state dict for `model`; ValueError on a missing, extra or misshapen entry."""
    state = model.state_dict()
    incoming = arrays_to_state_dict(arrays)
    if incoming.keys() != state.keys():
        missing, extra = state.keys() - incoming.keys(), incoming.keys() - state.keys()
        raise ValueError(f"arrays do not match the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for key, tensor in incoming.items():
        if tensor.shape != state[key].shape:
            raise ValueError(f"array {key!r} has shape {tuple(tensor.shape)}, model expects {tuple(state[key].shape)}")
    return incoming


def arrays_to_vector(arrays: ArrayRecord) -> np.ndarray:
    """All arrays flattened into one float64 vector (in record order)."""
    return np.concatenate([np.asarray(a.numpy(), dtype=np.float64).ravel() for a in arrays.values()])


def vector_to_arrays(vector: np.ndarray, like: ArrayRecord) -> ArrayRecord:
    """Inverse of `arrays_to_vector`, shaped and typed like `like`."""
    out, offset = OrderedDict(), 0
    for key, array in like.items():
        ref = array.numpy()
        out[key] = np.asarray(vector[offset: offset + ref.size], dtype=ref.dtype).reshape(ref.shape)
        offset += ref.size
    if offset != len(vector):
        raise ValueError(f"vector has {len(vector)} entries, arrays need {offset}")
    return ArrayRecord(out)


def arrays_nbytes(arrays: ArrayRecord) -> int:
    # From shape and dtype: Array.numpy() would deserialise every array just to count it. A reply's shape
    # is the sender's word: one that claims more than the bytes that came (or a negative size) counts those.
    return sum(_array_nbytes(a) for a in arrays.values())


def _array_nbytes(array) -> int:
    declared = math.prod(array.shape) * np.dtype(array.dtype).itemsize
    return declared if 0 <= declared <= len(array.data) else len(array.data)


def recorddict_nbytes(content: RecordDict) -> int:
    """Payload bytes of a message: arrays plus scalars (8 bytes each) and strings."""
    total = 0
    for record in content.values():
        if isinstance(record, ArrayRecord):
            total += arrays_nbytes(record)
        elif isinstance(record, (ConfigRecord, MetricRecord)):
            for value in record.values():
                values = value if isinstance(value, list) else [value]
                total += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in values)
    return total


# No weight, control variate or counter of a model trained here comes near this; a reply that does is an
# overflow attack, not an update: FedYogi's v += delta^2 overflows float32 from 1.8e19, SCAFFOLD's c sums
# deltas round after round, and a finite 1e25 would still wreck an average. (Bounding honest-looking
# updates is Byzantine-robust aggregation, which this screen does not attempt.)
MAX_ABS_VALUE = 1e6


def magnitude_problem(values: np.ndarray) -> str | None:
    """NaN, inf, or values so large that one reply would wreck the aggregate (or overflow FedYogi's v)."""
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        return "holds NaN or inf"
    if values.size and float(np.abs(values).max()) > MAX_ABS_VALUE:
        return f"holds values beyond +-{MAX_ABS_VALUE:g}"
    return None
