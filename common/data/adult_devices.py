"""UCI Adult as Hu et al. (2021) split it: 16 devices x 3052 samples, 80/10/10 per device.

The paper "evenly assign[s] the original Adult data to 16 devices such that
each device contains 3052 data samples" and splits each device 80% train /
10% test / 10% validation. 16 x 3052 = 48,832 is all 48,842 UCI rows but 10, so
the paper pools `adult.data` and `adult.test` and keeps the rows with missing
values. We do the same, and decide what the paper leaves open:

* Rows: every record of both files (32,561 + 16,281 = 48,842), rows with "?"
  kept. A "?" in a categorical column encodes as all zeros in that column's
  one-hot block (no numeric column has missing values in the UCI files).
* Features: the 104 columns of `adult.py` (6 standardised numerics, then the
  8 one-hot blocks), so models are interchangeable with the `uci` split. The
  vocabulary is `adult.py`'s: the values seen in the complete rows of
  `adult.data` (98 one-hot columns; the only value it lacks, workclass
  "Never-worked", occurs only in rows missing the occupation, and encodes as
  all zeros like a missing value); the
  numeric mean and population std are taken over all 48,842 rows (public
  preprocessing, not a per-device statistic).
* Assignment: a permutation of the 48,842 rows drawn from
  `numpy_rng(seed, "adult-hu-devices")`; device d gets rows
  [3052 d, 3052 (d+1)) of it (the last 10 rows are unused). IID, as the paper.
* Per device: 2442 train, 305 validation, 305 test (80/10/10 of 3052 rounded
  so the three add up), in permutation order. m = 2442 is the local dataset
  size of the accounting (digest ambiguity 3: the training split).
* `num-clients` < 16 keeps the first `num-clients` devices (for tests).

The server's pooled evaluation set is the union of the devices' test splits
(or validation splits with `adult-eval = "val"`, for tuning): with equal
device sizes its accuracy is the paper's "average test accuracy over all
devices". Each client's own test split is its validation or test split
accordingly.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from common.seeding import numpy_rng

from .adult import (CATEGORICAL, COLUMNS, FOLDER, NUMERIC, POSITIVE, TEST_FILE, TRAIN_FILE, check_fields,
                    check_records, records)
from .errors import require_file
from .federation import ClientData, Federation
from .provenance import file_records

NUM_DEVICES = 16
DEVICE_SIZE = 3052
TRAIN, VAL, TEST = 2442, 305, 305
assert TRAIN + VAL + TEST == DEVICE_SIZE
MISSING = "?"


def read_all_rows(path: str | Path) -> list[list[str]]:
    """Every record of one UCI Adult file as 15 stripped strings ('?' kept; test labels' '.' removed)."""
    rows = []
    for lineno, fields in records(path):
        fields[-1] = fields[-1].rstrip(".")
        check_fields(fields, path, lineno)
        rows.append(fields)
    check_records(path, len(rows))  # a short file would leave the last devices short or empty
    return rows


def encode_rows(rows: list[list[str]], vocab: dict[str, list[str]]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(x float32 [n, 104], y int64, feature names): numerics standardised over `rows`, one-hot blocks."""
    n = len(rows)
    col = {name: i for i, name in enumerate(COLUMNS)}
    numeric = np.array([[float(r[col[c]]) for c in NUMERIC] for r in rows], dtype=np.float64).reshape(n, len(NUMERIC))
    mean, std = numeric.mean(axis=0), numeric.std(axis=0)
    std[std == 0] = 1.0
    blocks = [(numeric - mean) / std]
    for c in CATEGORICAL:
        index = {v: j for j, v in enumerate(vocab[c])}
        onehot = np.zeros((n, len(vocab[c])), dtype=np.float64)
        pos = np.array([index.get(r[col[c]], -1) for r in rows], dtype=np.int64)
        known = pos >= 0
        onehot[np.flatnonzero(known), pos[known]] = 1.0
        blocks.append(onehot)
    x = np.concatenate(blocks, axis=1).astype(np.float32)
    y = np.array([r[-1] == POSITIVE for r in rows], dtype=np.int64)
    names = list(NUMERIC) + [f"{c}={v}" for c in CATEGORICAL for v in vocab[c]]
    return x, y, names


@lru_cache(maxsize=2)
def _pooled(folder: str) -> tuple[np.ndarray, np.ndarray, list[str], int]:
    """All 48,842 rows encoded (cached per process: every seed re-deals the same rows)."""
    folder_path = Path(folder)
    train_rows = read_all_rows(require_file(folder_path / TRAIN_FILE, "adult"))
    rows = train_rows + read_all_rows(require_file(folder_path / TEST_FILE, "adult"))
    col = {name: i for i, name in enumerate(COLUMNS)}
    complete = [r for r in train_rows if MISSING not in r]  # adult.py's vocabulary: 104 features
    vocab = {c: sorted({r[col[c]] for r in complete}) for c in CATEGORICAL}
    x, y, names = encode_rows(rows, vocab)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y, names, sum(MISSING in r for r in rows)


def load_adult_devices(data_dir: str | Path, num_devices: int, seed: int, evaluate_on: str = "test") -> Federation:
    """The Hu et al. device federation (module docstring); `evaluate_on` is 'test' or 'val'."""
    if not 1 <= num_devices <= NUM_DEVICES:
        raise ValueError(f"the Hu et al. Adult split has at most {NUM_DEVICES} devices; got {num_devices}")
    if evaluate_on not in ("test", "val"):
        raise ValueError(f"evaluate_on must be 'test' or 'val', got {evaluate_on!r}")
    folder = Path(data_dir) / FOLDER
    x, y, names, missing = _pooled(str(folder))
    order = numpy_rng(seed, "adult-hu-devices").permutation(len(y))
    clients, evals_x, evals_y = [], [], []
    for d in range(num_devices):
        idx = order[d * DEVICE_SIZE:(d + 1) * DEVICE_SIZE]
        tr, va, te = idx[:TRAIN], idx[TRAIN:TRAIN + VAL], idx[TRAIN + VAL:]
        held = va if evaluate_on == "val" else te
        clients.append(ClientData(x[tr], y[tr], x[held], y[held]))
        evals_x.append(x[held])
        evals_y.append(y[held])
    return Federation(
        clients=clients,
        x_test=np.concatenate(evals_x),
        y_test=np.concatenate(evals_y),
        input_shape=(x.shape[1],),
        num_classes=2,
        description=(f"adult (Hu et al. devices): {len(y)} pooled rows, {num_devices} devices x {DEVICE_SIZE} "
                     f"({TRAIN} train / {VAL} val / {TEST} test, seed {seed}); server evaluates on the devices' "
                     f"{evaluate_on} splits ({num_devices * (VAL if evaluate_on == 'val' else TEST)} samples)"),
        meta={"dataset": "adult", "split": "hu-devices", "evaluate_on": evaluate_on, "seed": seed,
              "feature_names": names, "client_sizes": [TRAIN] * num_devices, "rows": len(y),
              "missing_rows": missing, "folder": str(folder),
              "files": file_records([folder / TRAIN_FILE, folder / TEST_FILE])},
    )
