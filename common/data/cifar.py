"""CIFAR-10 from the original "python version" pickles (no torchvision).

Layout: `<data-dir>/cifar-10-batches-py/data_batch_1 .. data_batch_5` (train,
50,000 images) and `test_batch` (10,000), as in the publisher's
cifar-10-python.tar.gz (and as torchvision extracts it). Each file is a
pickled dict with b"data" (uint8, (10000, 3072): 1024 red, 1024 green, 1024
blue values per image, each channel row-major 32x32) and b"labels" (list of
ints 0..9).

Images become float32 (n, 3, 32, 32): pixel/255, then per channel
(x - mean_c) / std_c with the training set's per-channel pixel mean
(0.4914, 0.4822, 0.4465) and std (0.2470, 0.2435, 0.2616), same constants for
train and test. (Many codebases use std (0.2023, 0.1994, 0.2010), which is
not the pixel std; we use the true one.) Labels are int64.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from .errors import DataFileCorrupt, require_file
from .provenance import file_records
from .splits import Splits

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def read_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled CIFAR-10 batch -> (uint8 images (n, 3, 32, 32), int64 labels (n,)).

    A damaged file raises DataFileCorrupt naming it."""
    with open(path, "rb") as fh:
        try:
            d = pickle.load(fh, encoding="bytes")
        except Exception as e:  # noqa: BLE001 (a damaged pickle can raise almost anything)
            raise DataFileCorrupt(path, "cifar10", f"cannot unpickle it ({type(e).__name__}: {e})") from None
    data = d.get(b"data", d.get("data")) if isinstance(d, dict) else None
    labels = d.get(b"labels", d.get("labels")) if isinstance(d, dict) else None
    if data is None or labels is None:
        raise DataFileCorrupt(path, "cifar10", "not a CIFAR-10 batch (no data/labels entries)")
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataFileCorrupt(path, "cifar10", f"expected uint8 data of shape (n, 3072), got {data.dtype} {data.shape}")
    labels = np.asarray(labels)
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise DataFileCorrupt(path, "cifar10", f"{len(data)} images but labels of {labels.dtype} {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataFileCorrupt(path, "cifar10", f"labels must be 0..9, found {labels.min()}..{labels.max()}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _normalise(x: np.ndarray) -> np.ndarray:
    out = x.astype(np.float32)
    out *= np.float32(1.0 / 255.0)
    out -= np.asarray(MEAN, dtype=np.float32)[None, :, None, None]
    out /= np.asarray(STD, dtype=np.float32)[None, :, None, None]
    return out


def load_cifar10(data_dir: str | Path) -> Splits:
    folder = Path(data_dir) / FOLDER
    train_paths = [require_file(folder / f, "cifar10") for f in TRAIN_FILES]
    test_path = require_file(folder / TEST_FILE, "cifar10")
    train = [read_batch(p) for p in train_paths]
    x_test, y_test = read_batch(test_path)
    return Splits(
        x_train=_normalise(np.concatenate([b[0] for b in train])),
        y_train=np.concatenate([b[1] for b in train]),
        x_test=_normalise(x_test),
        y_test=y_test,
        num_classes=10,
        name="cifar10",
        meta={"mean": MEAN, "std": STD, "folder": str(folder), "files": file_records([*train_paths, test_path])},
    )
