"""common.data without dataset files: generator, partitioners, dispatch, errors, tiny fake files."""

from __future__ import annotations

import gzip
import importlib
import pickle
import sys

import numpy as np
import pytest

from common.config import validate
from common.data import (
    DataFileMissing,
    PartitionError,
    clear_cache,
    generate_synthetic,
    load_client,
    load_federation,
    load_test_set,
    partition,
)
from common.data.cifar import load_cifar10
from common.data.idx import load_idx_dataset, read_idx


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def label_skew(parts, labels, num_classes):
    """Mean total-variation distance between each client's label histogram and the pooled one."""
    pooled = np.bincount(labels, minlength=num_classes) / len(labels)
    return float(np.mean([
        0.5 * np.abs(np.bincount(labels[p], minlength=num_classes) / len(p) - pooled).sum()
        for p in parts
    ]))


def assert_disjoint_complete(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n))


# --------------------------------------------------------------------- synthetic


def test_synthetic_sizes_split_and_dtypes():
    fed = generate_synthetic(num_clients=12, dim=20, classes=2, alpha=0.5, beta=0.5, iid=False, seed=3)
    assert fed.num_clients == 12 and fed.input_shape == (20,) and fed.num_classes == 2
    sizes = fed.meta["samples_per_client"]
    for c, n in zip(fed.clients, sizes):
        assert n >= 50
        assert c.num_train + len(c.y_test) == n
        assert c.num_train == (9 * n) // 10  # floor(0.9 n)
        assert c.x_train.shape == (c.num_train, 20) and c.x_train.dtype == np.float32
        assert c.y_train.dtype == np.int64 and c.y_test.dtype == np.int64
        assert set(np.unique(c.y_train)) <= {0, 1}
    assert np.array_equal(fed.x_test, np.concatenate([c.x_test for c in fed.clients]))
    assert np.array_equal(fed.y_test, np.concatenate([c.y_test for c in fed.clients]))


def test_synthetic_deterministic_from_seed():
    a = generate_synthetic(5, 10, 3, 1.0, 1.0, False, seed=7)
    b = generate_synthetic(5, 10, 3, 1.0, 1.0, False, seed=7)
    c = generate_synthetic(5, 10, 3, 1.0, 1.0, False, seed=8)
    for ca, cb in zip(a.clients, b.clients):
        assert np.array_equal(ca.x_train, cb.x_train) and np.array_equal(ca.y_train, cb.y_train)
        assert np.array_equal(ca.x_test, cb.x_test)
    assert a.meta["samples_per_client"] != c.meta["samples_per_client"] or not np.array_equal(
        a.clients[0].x_train, c.clients[0].x_train)


def test_synthetic_heterogeneity_vs_iid():
    het = generate_synthetic(30, 20, 2, 1.0, 1.0, iid=False, seed=0)
    iid = generate_synthetic(30, 20, 2, 1.0, 1.0, iid=True, seed=0)

    def mean_spread(fed):  # spread across clients of the per-client feature means
        return float(np.stack([c.x_train.mean(0) for c in fed.clients]).std(0).mean())

    def skew(fed):
        y = np.concatenate([c.y_train for c in fed.clients])
        bounds = np.cumsum([0] + [c.num_train for c in fed.clients])
        parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(fed.num_clients)]
        return label_skew(parts, y, fed.num_classes)

    assert mean_spread(het) > 10 * mean_spread(iid)
    assert skew(het) > 3 * skew(iid)


def test_synthetic_iid_feature_variance_is_j_pow_minus_1_2():
    # Sigma is a covariance: coordinate j (1-based) has variance j^-1.2, mean 0 in the iid case.
    fed = generate_synthetic(30, 8, 2, 0.0, 0.0, iid=True, seed=1)
    x = np.concatenate([c.x_train for c in fed.clients]).astype(np.float64)
    assert len(x) > 3000
    expected = np.arange(1, 9) ** -1.2
    np.testing.assert_allclose(x.var(0), expected, rtol=0.15)
    np.testing.assert_allclose(x.mean(0), 0.0, atol=0.1)


def test_synthetic_beta_is_a_std():
    # B_k ~ N(0, beta) with beta a std: a client's feature mean averaged over the coordinates
    # is B_k + O(1/sqrt(dim)), so its spread across clients is ~beta (it would be ~sqrt(beta)
    # if beta were a variance).
    fed = generate_synthetic(100, 50, 2, 0.0, 3.0, False, seed=4)
    centres = np.array([c.x_train.mean() for c in fed.clients])
    assert 2.4 < centres.std() < 3.6


def test_synthetic_alpha_cancels_in_the_argmax():
    # Faithful to Li et al.: u_k is one scalar added to every entry of W_k and b_k, so it shifts
    # all class logits by the same u_k * (sum(x) + 1) and never changes the argmax. The labels
    # (and features) for a seed are therefore the same for every alpha.
    a = generate_synthetic(6, 20, 3, 0.0, 1.0, False, seed=2)
    b = generate_synthetic(6, 20, 3, 5.0, 1.0, False, seed=2)
    for ca, cb in zip(a.clients, b.clients):
        assert np.array_equal(ca.x_train, cb.x_train)
        assert np.array_equal(ca.y_train, cb.y_train)


def test_synthetic_rejects_bad_arguments():
    with pytest.raises(ValueError):
        generate_synthetic(0, 10, 2, 0.5, 0.5, False, 0)
    with pytest.raises(ValueError):
        generate_synthetic(2, 10, 1, 0.5, 0.5, False, 0)


# -------------------------------------------------------------------- partitions

LABELS = np.repeat(np.arange(10), 300)  # 3000 samples, 10 balanced labels


def test_iid_partition_disjoint_complete_balanced():
    parts = partition.iid(1003, 10, np.random.default_rng(0))
    assert_disjoint_complete(parts, 1003)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    again = partition.iid(1003, 10, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(PartitionError):
        partition.iid(3, 5, np.random.default_rng(0))


def test_dirichlet_partition_disjoint_complete_and_skewed():
    rng = np.random.default_rng(1)
    labels = rng.permutation(LABELS)
    skewed = partition.dirichlet(labels, 10, 0.05, np.random.default_rng(0), min_size=10)
    assert_disjoint_complete(skewed, len(labels))
    assert min(len(p) for p in skewed) >= 10
    flat = partition.iid(len(labels), 10, np.random.default_rng(0))
    assert label_skew(skewed, labels, 10) > 0.5
    assert label_skew(skewed, labels, 10) > 5 * label_skew(flat, labels, 10)
    mild = partition.dirichlet(labels, 10, 100.0, np.random.default_rng(0))
    assert label_skew(mild, labels, 10) < label_skew(skewed, labels, 10)
    again = partition.dirichlet(labels, 10, 0.05, np.random.default_rng(0), min_size=10)
    assert all(np.array_equal(a, b) for a, b in zip(skewed, again))


def test_dirichlet_gives_a_clear_error_when_impossible():
    with pytest.raises(PartitionError, match="min_size|samples"):
        partition.dirichlet(np.zeros(40, dtype=np.int64), 5, 0.5, np.random.default_rng(0), min_size=10)
    # one label, tiny alpha: one client takes (almost) everything on every draw
    with pytest.raises(PartitionError, match="dirichlet-alpha"):
        partition.dirichlet(np.zeros(1000, dtype=np.int64), 5, 1e-4, np.random.default_rng(0),
                            min_size=10, max_tries=5)


def test_classes_partition_five_by_two_is_disjoint():
    labels = np.random.default_rng(2).permutation(LABELS)
    parts = partition.classes(labels, 5, 2, np.random.default_rng(0))
    assert_disjoint_complete(parts, len(labels))
    sets = [set(np.unique(labels[p]).tolist()) for p in parts]
    assert all(len(s) == 2 for s in sets)
    assert set().union(*sets) == set(range(10))  # 5 x 2 = 10 labels: pairwise disjoint


def test_classes_partition_overlapping_holders_and_errors():
    labels = np.random.default_rng(3).permutation(LABELS)
    parts = partition.classes(labels, 7, 3, np.random.default_rng(0))
    assert_disjoint_complete(parts, len(labels))
    holders = np.zeros(10, dtype=int)
    for p in parts:
        held = np.unique(labels[p])
        assert len(held) == 3
        holders[held] += 1
    assert holders.min() >= 1 and holders.max() - holders.min() <= 1
    with pytest.raises(PartitionError, match="cover"):
        partition.classes(labels, 4, 2, np.random.default_rng(0))  # 8 < 10 labels
    with pytest.raises(PartitionError):
        partition.classes(labels, 5, 11, np.random.default_rng(0))


def test_natural_partition():
    owner = np.array([3, 0, 3, 7, 0, 0])
    parts = partition.natural(owner)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [0, 2], [3]]
    assert_disjoint_complete(parts, len(owner))


# ---------------------------------------------------------------------- dispatch


def test_load_federation_synthetic_and_cache():
    cfg = validate({"dataset": "synthetic", "num-clients": 4, "synthetic-dim": 20,
                    "synthetic-classes": 2, "seed": 5})
    fed = load_federation(cfg)
    assert fed.num_clients == 4 and fed.input_shape == (20,)
    assert load_federation(cfg) is fed  # cached per process
    assert load_federation(cfg.replace(lr=0.5)) is fed  # training keys do not invalidate it
    assert load_federation(cfg.replace(seed=6)) is not fed
    assert load_client(cfg, 3) is fed.clients[3]
    x, y = load_test_set(cfg)
    assert x.shape == (len(y), 20)
    ref = generate_synthetic(4, 20, 2, 0.5, 0.5, False, 5)
    assert np.array_equal(ref.clients[2].x_train, fed.clients[2].x_train)
    for bad in (4, -1, "0", True):
        with pytest.raises(ValueError):
            load_client(cfg, bad)


def test_released_needs_thirty_clients():
    with pytest.raises(ValueError, match="30"):
        load_federation({"dataset": "syn-iid", "num-clients": 2, "data-dir": "/nonexistent"})


@pytest.mark.parametrize(
    ("dataset", "relpath"),
    [
        ("mnist", "mnist/train-images-idx3-ubyte.gz"),
        ("fashion-mnist", "fashion-mnist/train-images-idx3-ubyte.gz"),
        ("cifar10", "cifar-10-batches-py/data_batch_1"),
        ("adult", "adult/adult.data"),
        ("syn-0.5-0.5", "fedprox-synthetic/syn_0.5_0.5.npz"),
    ],
)
def test_missing_file_raises_data_file_missing(tmp_path, dataset, relpath):
    num_clients = 30 if dataset.startswith("syn-") else 2
    cfg = validate({"dataset": dataset, "data-dir": str(tmp_path), "num-clients": num_clients})
    with pytest.raises(DataFileMissing) as info:
        load_federation(cfg)
    err = info.value
    assert isinstance(err, FileNotFoundError)
    msg = str(err)
    assert str(tmp_path / relpath) in msg
    assert str((tmp_path / relpath).parent) in msg
    assert "data-dir" in msg and "PRIVFED_DATA_DIR" in msg
    if dataset in ("mnist", "fashion-mnist", "cifar10"):
        assert "privfed[vision]" in msg and "privfed data download" in msg
    assert err.filename == str(tmp_path / relpath)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is DataFileMissing and str(clone) == msg


def test_data_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVFED_DATA_DIR", str(tmp_path))
    with pytest.raises(DataFileMissing, match=str(tmp_path / "adult")):
        load_federation(validate({"dataset": "adult"}))


# ------------------------------------------------------------- tiny fake files


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_idx_reader_on_fake_files(tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    img_train = rng.integers(0, 256, (6, 28, 28))
    img_test = rng.integers(0, 256, (3, 28, 28))
    _write_idx(folder / "train-images-idx3-ubyte.gz", img_train)
    _write_idx(folder / "train-labels-idx1-ubyte.gz", np.array([0, 1, 2, 3, 4, 5]))
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", img_test)
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.array([9, 8, 7]))
    assert np.array_equal(read_idx(folder / "train-images-idx3-ubyte.gz"), img_train)
    s = load_idx_dataset("mnist", tmp_path)
    assert s.x_train.shape == (6, 1, 28, 28) and s.x_train.dtype == np.float32
    assert s.y_test.tolist() == [9, 8, 7] and s.y_test.dtype == np.int64
    np.testing.assert_allclose(s.x_train[:, 0], (img_train / 255 - 0.1307) / 0.3081, rtol=1e-5, atol=1e-5)
    (folder / "bad.gz").write_bytes(gzip.compress(b"\x01\x02\x08\x01"))
    with pytest.raises(ValueError, match="idx"):
        read_idx(folder / "bad.gz")


def test_cifar_reader_on_fake_files(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (4, 3072)).astype(np.uint8)
        labels = rng.integers(0, 10, 4).tolist()
        batches[name] = (data, labels)
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": name.encode()}, fh)
    s = load_cifar10(tmp_path)
    assert s.x_train.shape == (20, 3, 32, 32) and s.x_test.shape == (4, 3, 32, 32)
    assert s.y_train.tolist() == sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    green = batches["data_batch_1"][0][0, 1024:2048].reshape(32, 32)
    np.testing.assert_allclose(s.x_train[0, 1], (green / 255 - 0.4822) / 0.2435, rtol=1e-5, atol=1e-5)
    cfg = validate({"dataset": "cifar10", "data-dir": str(tmp_path), "num-clients": 2})
    fed = load_federation(cfg)
    assert fed.num_clients == 2 and sum(c.num_train for c in fed.clients) == 20
    assert fed.clients[0].x_test.shape == (0, 3, 32, 32) and len(fed.y_test) == 4


def test_download_is_explicit_and_lazy(tmp_path, monkeypatch):
    import common.data.download as dl

    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` now fails
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    dl = importlib.reload(dl)  # module import must not need torchvision
    with pytest.raises(ImportError, match=r"privfed\[vision\]"):
        dl.download("mnist", tmp_path / "d")
    with pytest.raises(ValueError, match="syn-iid"):
        dl.download("syn-iid", tmp_path / "d")
