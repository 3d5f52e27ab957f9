"""Damaged data files give one clear error naming the file (DataFileCorrupt), never a
traceback from gzip/zipfile/pickle or a silently wrong dataset. No real data needed."""

from __future__ import annotations

import gzip
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

from common.data import clear_cache, load_released
from common.data.adult import load_adult
from common.data.adult_devices import load_adult_devices
from common.data.cifar import load_cifar10
from common.data.errors import DataFileCorrupt, DataFileError
from common.data.idx import load_idx_dataset



@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def corrupt(excinfo, path: Path) -> str:
    """The error is a DataFileCorrupt (so a DataFileError and a ValueError) naming `path`, on one line."""
    err = excinfo.value
    assert isinstance(err, DataFileCorrupt) and isinstance(err, DataFileError) and isinstance(err, ValueError)
    msg = str(err)
    assert str(path) in msg and "\n" not in msg
    assert str(pickle.loads(pickle.dumps(err))) == msg
    return msg


# ------------------------------------------------------------------- idx

def _write_idx(path, array, compress=True):
    raw = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw += array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.fixture
def mnist_dir(tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    _write_idx(folder / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (6, 28, 28)))
    _write_idx(folder / "train-labels-idx1-ubyte.gz", np.arange(6))
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (3, 28, 28)))
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.array([9, 8, 7]))
    load_idx_dataset("mnist", tmp_path)  # the intact set loads
    return tmp_path


def test_idx_truncated_gzip(mnist_dir):
    path = mnist_dir / "mnist" / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DataFileCorrupt) as info:
        load_idx_dataset("mnist", mnist_dir)
    assert "privfed data download mnist" in corrupt(info, path)


def test_idx_not_gzip(mnist_dir):
    path = mnist_dir / "mnist" / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(b"<html>404</html>")
    with pytest.raises(DataFileCorrupt) as info:
        load_idx_dataset("mnist", mnist_dir)
    corrupt(info, path)


def test_idx_truncated_plain_file_is_a_data_file_error(mnist_dir):
    path = mnist_dir / "mnist" / "t10k-labels-idx1-ubyte.gz"
    path.unlink()
    plain = path.with_suffix("")
    _write_idx(plain, np.array([9, 8, 7]), compress=False)
    plain.write_bytes(plain.read_bytes()[:-1])
    with pytest.raises(DataFileCorrupt) as info:
        load_idx_dataset("mnist", mnist_dir)
    assert "truncated" in corrupt(info, plain)


def test_idx_labels_out_of_range(mnist_dir):
    path = mnist_dir / "mnist" / "t10k-labels-idx1-ubyte.gz"
    _write_idx(path, np.array([9, 200, 7]))
    with pytest.raises(DataFileCorrupt) as info:
        load_idx_dataset("mnist", mnist_dir)
    assert "0..9" in corrupt(info, path)


# ------------------------------------------------------- released Synthetic

def _write_released(data_dir: Path, **change) -> Path:
    rng = np.random.default_rng(0)
    owner_tr, owner_te = np.repeat(np.arange(30), 3), np.arange(30)
    arrays = {"x_train": rng.normal(size=(90, 20)), "y_train": rng.integers(0, 2, 90), "client_train": owner_tr,
              "x_test": rng.normal(size=(30, 20)), "y_test": rng.integers(0, 2, 30), "client_test": owner_te}
    arrays.update(change)
    folder = data_dir / "fedprox-synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "syn_iid.npz", **arrays)
    return folder / "syn_iid.npz"


def test_released_fake_file_loads(tmp_path):
    _write_released(tmp_path)
    fed = load_released("syn-iid", tmp_path)
    assert [c.num_train for c in fed.clients] == [3] * 30 and len(fed.y_test) == 30


def test_released_truncated(tmp_path):
    path = _write_released(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataFileCorrupt) as info:
        load_released("syn-iid", tmp_path)
    assert "fedprox-synthetic" in corrupt(info, path)


def test_released_nan_features(tmp_path):
    x = np.random.default_rng(1).normal(size=(90, 20))
    x[5, 3] = np.nan
    path = _write_released(tmp_path, x_train=x)
    with pytest.raises(DataFileCorrupt) as info:
        load_released("syn-iid", tmp_path)
    assert "NaN" in corrupt(info, path)


def test_released_bad_labels_name_the_file(tmp_path):
    path = _write_released(tmp_path, y_test=np.full(30, 2))
    with pytest.raises(DataFileCorrupt) as info:
        load_released("syn-iid", tmp_path)
    corrupt(info, path)


# ----------------------------------------------------------------- CIFAR-10

@pytest.fixture
def cifar_dir(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": rng.integers(0, 256, (4, 3072)).astype(np.uint8),
                         b"labels": rng.integers(0, 10, 4).tolist()}, fh)
    load_cifar10(tmp_path)
    return tmp_path


def test_cifar_truncated_batch(cifar_dir):
    path = cifar_dir / "cifar-10-batches-py" / "data_batch_3"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataFileCorrupt) as info:
        load_cifar10(cifar_dir)
    assert "privfed data download cifar10" in corrupt(info, path)


def test_cifar_labels_out_of_range(cifar_dir):
    path = cifar_dir / "cifar-10-batches-py" / "test_batch"
    with open(path, "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 10]}, fh)
    with pytest.raises(DataFileCorrupt) as info:
        load_cifar10(cifar_dir)
    assert "0..9" in corrupt(info, path)


# -------------------------------------------------------------------- Adult

ROW = ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
       "2174, 0, 40, United-States, <=50K")


def _write_adult(data_dir: Path, train_rows: list[str], test_rows: list[str]) -> Path:
    folder = data_dir / "adult"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adult.data").write_text("\n".join(train_rows) + "\n\n")
    (folder / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(r + "." for r in test_rows) + "\n")
    return folder


def test_adult_short_file_is_refused(tmp_path):
    folder = _write_adult(tmp_path, [ROW] * 5, [ROW] * 3)
    with pytest.raises(DataFileCorrupt) as info:
        load_adult(tmp_path)
    assert "32561" in corrupt(info, folder / "adult.data")


def test_adult_devices_short_file_is_refused(tmp_path):
    # before: devices past the end of the rows came out short or empty, without complaint
    folder = _write_adult(tmp_path, [ROW] * 5, [ROW] * 3)
    with pytest.raises(DataFileCorrupt) as info:
        load_adult_devices(tmp_path, 16, 0)
    corrupt(info, folder / "adult.data")


@pytest.mark.parametrize("age", ["abc", "nan", "inf"])
def test_adult_non_numeric_field(tmp_path, age):
    folder = _write_adult(tmp_path, [ROW, ROW.replace("39,", f"{age},", 1)], [ROW])
    with pytest.raises(DataFileCorrupt) as info:
        load_adult(tmp_path)
    assert "line 2" in corrupt(info, folder / "adult.data")


def test_adult_binary_garbage(tmp_path):
    folder = _write_adult(tmp_path, [ROW], [ROW])
    (folder / "adult.test").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    with pytest.raises(DataFileCorrupt) as info:
        load_adult(tmp_path)
    corrupt(info, folder / "adult.test")


# ----------------------------------------------------------------- the CLI

def test_cli_damaged_file_is_one_line(capsys, tmp_path):
    from cli.main import main

    path = _write_released(tmp_path)
    path.write_bytes(path.read_bytes()[:100])
    code = main(["run", "default", "--set", 'dataset="syn-iid"', "--set", "num-clients=30",
                 "--set", f'data-dir="{tmp_path}"', "--set", f'results-dir="{tmp_path / "results"}"'])
    err = capsys.readouterr().err
    assert code == 2 and str(path) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_released_lone_npy_array(tmp_path):
    path = _write_released(tmp_path)
    with open(path, "wb") as fh:
        np.save(fh, np.zeros(3))
    with pytest.raises(DataFileCorrupt) as info:
        load_released("syn-iid", tmp_path)
    assert ".npy" in corrupt(info, path)


def test_cli_impossible_partition_is_one_line(capsys, cifar_dir):
    """20 samples cannot give 5 clients >= 10 each: a config problem, reported without a traceback."""
    from cli.main import main

    code = main(["run", "default", "--set", 'dataset="cifar10"', "--set", 'partition="dirichlet"',
                 "--set", "num-clients=5", "--set", f'data-dir="{cifar_dir}"',
                 "--set", f'results-dir="{cifar_dir / "results"}"'])
    err = capsys.readouterr().err
    assert code == 2 and "dirichlet" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["text", "complex"])
def test_released_non_real_feature_dtype_is_refused_as_damaged(tmp_path, kind):
    """(review, session 21) released.py promises 'anything else raises DataFileCorrupt' (naming the file); a non-numeric
    x_train escapes as a bare numpy ValueError ("could not convert string to float"), and complex
    features load silently with their imaginary parts dropped (a silently different dataset)."""
    x = np.random.default_rng(1).normal(size=(90, 20))
    x_bad = np.full(x.shape, "abc") if kind == "text" else x + 1j
    path = _write_released(tmp_path, x_train=x_bad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataFileCorrupt) as info:
            load_released("syn-iid", tmp_path)
    assert str(path) in str(info.value)
