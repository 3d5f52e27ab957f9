"""MNIST and Fashion-MNIST from their original idx files (no torchvision).

Layout under the data folder (the publishers' file names, gzip-compressed;
an already-decompressed copy without `.gz` is read too):

    <data-dir>/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
    <data-dir>/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz

IDX format: big-endian; bytes 0-1 zero, byte 2 the element type (0x08 =
unsigned byte), byte 3 the number of dimensions, then one uint32 per
dimension, then the data, row-major.

Images become float32 of shape (n, 1, 28, 28): pixel/255, then normalised
with the dataset's usual training-set mean and std,
    MNIST (0.1307, 0.3081), Fashion-MNIST (0.2860, 0.3530),
the same constants for train and test. Labels are int64 in 0..9.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from .errors import DataFileCorrupt, DataFileMissing
from .provenance import file_records
from .splits import Splits

FOLDERS = {"mnist": "mnist", "fashion-mnist": "fashion-mnist"}
MEAN_STD = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}
FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str | Path, dataset: str = "idx") -> np.ndarray:
    """Read one idx file (gzip-compressed if its name ends in .gz) as a uint8 array.

    A damaged file raises DataFileCorrupt naming it (`dataset` goes in the message)."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:  # not gzip, truncated, bad deflate data
            raise DataFileCorrupt(path, dataset, f"cannot decompress it ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataFileCorrupt(path, dataset, "not an idx file (bad magic number)")
    if raw[2] != 0x08:
        raise DataFileCorrupt(path, dataset, f"idx element type 0x{raw[2]:02x} is not unsigned byte (0x08)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        raise DataFileCorrupt(path, dataset, f"{len(raw)} bytes where its header {dims} says {expected} "
                                             f"(truncated?)")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _locate(folder: Path, stem: str, dataset: str) -> Path:
    gz = folder / f"{stem}.gz"
    if gz.is_file():
        return gz
    plain = folder / stem
    if plain.is_file():
        return plain
    raise DataFileMissing(gz, dataset)


def load_idx_dataset(dataset: str, data_dir: str | Path) -> Splits:
    """Read `dataset` ("mnist" or "fashion-mnist") from `<data_dir>/<dataset>/`."""
    if dataset not in FOLDERS:
        raise ValueError(f"unknown idx dataset {dataset!r}; expected one of {sorted(FOLDERS)}")
    folder = Path(data_dir) / FOLDERS[dataset]
    paths = {key: _locate(folder, stem, dataset) for key, stem in FILES.items()}  # all, before reading
    mean, std = MEAN_STD[dataset]
    arrays = {}
    for key, path in paths.items():
        a = read_idx(path, dataset)
        if key.startswith("x"):
            if a.ndim != 3 or a.shape[1:] != (28, 28):
                raise DataFileCorrupt(path, dataset, f"expected images of 28x28, got shape {a.shape}")
            x = a.astype(np.float32)[:, None, :, :]
            x *= np.float32(1.0 / 255.0)
            x -= np.float32(mean)
            x *= np.float32(1.0 / std)
            arrays[key] = x
        else:
            if a.ndim != 1 or (a.size and a.max() > 9):  # out-of-range labels would fail deep in torch
                raise DataFileCorrupt(path, dataset, f"expected labels 0..9 of shape (n,), got shape {a.shape}"
                                                     + (f", max {a.max()}" if a.size else ""))
            arrays[key] = a.astype(np.int64)
    for part in ("train", "test"):
        if len(arrays[f"x_{part}"]) != len(arrays[f"y_{part}"]):
            raise DataFileCorrupt(paths[f"y_{part}"], dataset, f"{len(arrays[f'y_{part}'])} labels but "
                                  f"{paths[f'x_{part}'].name} has {len(arrays[f'x_{part}'])} images")
    return Splits(num_classes=10, name=dataset, meta={"mean": mean, "std": std, "folder": str(folder), "files": file_records(paths.values())},
                  **arrays)


def load_mnist(data_dir: str | Path) -> Splits:
    return load_idx_dataset("mnist", data_dir)


def load_fashion_mnist(data_dir: str | Path) -> Splits:
    return load_idx_dataset("fashion-mnist", data_dir)
