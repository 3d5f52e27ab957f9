"""common.data readers on the real dataset files in ../shared/data (or $PRIVFED_DATA_DIR).

Each test skips when its files are absent; nothing is ever downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from common.config import validate
from common.data import clear_cache, load_client, load_federation, load_test_set, partition
from common.data.released import load_released

DATA = Path(os.environ.get("PRIVFED_DATA_DIR") or Path(__file__).parents[1].parent / "shared" / "data")


def need(*relpaths: str) -> Path:
    for rel in relpaths:
        if not (DATA / rel).is_file():
            pytest.skip(f"{DATA / rel} not present (set $PRIVFED_DATA_DIR); tests never download")
    return DATA


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


# ------------------------------------------------------------ released Synthetic

RELEASED = {  # README section 4: train, test samples
    "syn-iid": ("syn_iid.npz", 6043, 683),
    "syn-0-0": ("syn_0_0.npz", 12396, 1395),
    "syn-0.5-0.5": ("syn_0.5_0.5.npz", 7218, 818),
    "syn-1-1": ("syn_1_1.npz", 9430, 1063),
}


@pytest.mark.parametrize("name", list(RELEASED))
def test_released_federation_counts(name):
    file, n_train, n_test = RELEASED[name]
    data_dir = need(f"fedprox-synthetic/{file}")
    fed = load_released(name, data_dir)
    assert fed.num_clients == 30 and fed.input_shape == (20,) and fed.num_classes == 2
    assert sum(c.num_train for c in fed.clients) == n_train
    assert sum(len(c.y_test) for c in fed.clients) == n_test
    assert len(fed.y_test) == n_test and fed.x_test.shape == (n_test, 20)
    assert fed.x_test.dtype == np.float32 and fed.y_test.dtype == np.int64
    assert min(c.num_train for c in fed.clients) >= 45  # floor(0.9 * 50)
    # exact client partition: client k holds exactly the rows with owner k, in file order
    with np.load(data_dir / "fedprox-synthetic" / file) as d:
        for k in (0, 17, 29):
            rows = d["client_train"] == k
            assert np.array_equal(fed.clients[k].y_train, d["y_train"][rows])
            np.testing.assert_allclose(fed.clients[k].x_train, d["x_train"][rows], rtol=1e-6)
            assert np.array_equal(fed.clients[k].y_test, d["y_test"][d["client_test"] == k])


def test_released_through_load_federation():
    need("fedprox-synthetic/syn_1_1.npz")
    cfg = validate({"dataset": "syn-1-1", "num-clients": 30, "data-dir": str(DATA)})
    fed = load_federation(cfg)
    assert fed.num_clients == 30
    assert load_client(cfg, 29) is fed.clients[29]
    assert len(load_test_set(cfg)[1]) == 1063
    with pytest.raises(ValueError, match="out of range"):
        load_client(cfg, 30)


# ----------------------------------------------------------- MNIST / Fashion-MNIST

IDX = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
       "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
MNIST_TRAIN = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def mnist():
    from common.data.idx import load_idx_dataset
    return load_idx_dataset("mnist", need(*(f"mnist/{f}" for f in IDX)))


def test_mnist_counts_and_normalisation(mnist):
    assert mnist.x_train.shape == (60000, 1, 28, 28) and mnist.x_test.shape == (10000, 1, 28, 28)
    assert mnist.x_train.dtype == np.float32 and mnist.y_train.dtype == np.int64
    assert np.bincount(mnist.y_train).tolist() == MNIST_TRAIN
    assert np.bincount(mnist.y_test).tolist() == MNIST_TEST
    assert abs(float(mnist.x_train.mean(dtype=np.float64))) < 0.01
    assert abs(float(mnist.x_train.std(dtype=np.float64)) - 1.0) < 0.01
    assert np.isclose(mnist.x_train.min(), -0.1307 / 0.3081, atol=1e-5)


def test_fashion_mnist_counts_and_normalisation():
    from common.data.idx import load_idx_dataset
    s = load_idx_dataset("fashion-mnist", need(*(f"fashion-mnist/{f}" for f in IDX)))
    assert s.x_train.shape == (60000, 1, 28, 28) and s.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(s.y_train).tolist() == [6000] * 10
    assert np.bincount(s.y_test).tolist() == [1000] * 10
    assert abs(float(s.x_train.mean(dtype=np.float64))) < 0.01
    assert abs(float(s.x_train.std(dtype=np.float64)) - 1.0) < 0.01


def test_mnist_partitions(mnist):
    y = mnist.y_train
    parts = partition.classes(y, 5, 2, np.random.default_rng(0))
    sets = [set(np.unique(y[p]).tolist()) for p in parts]
    assert all(len(s) == 2 for s in sets) and set().union(*sets) == set(range(10))
    assert sum(len(p) for p in parts) == 60000
    parts = partition.dirichlet(y, 10, 0.05, np.random.default_rng(0))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(60000))


def test_mnist_through_load_federation():
    need(*(f"mnist/{f}" for f in IDX))
    cfg = validate({"dataset": "mnist", "data-dir": str(DATA), "num-clients": 10,
                    "partition": "dirichlet", "dirichlet-alpha": 0.1, "seed": 1})
    fed = load_federation(cfg)
    assert fed.num_clients == 10 and fed.input_shape == (1, 28, 28) and fed.num_classes == 10
    assert sum(c.num_train for c in fed.clients) == 60000 and len(fed.y_test) == 10000
    assert all(len(c.y_test) == 0 for c in fed.clients)
    assert load_federation(cfg) is fed


# -------------------------------------------------------------------- Adult


def test_adult_counts_encoding_and_balance():
    from common.data.adult import load_adult
    s = load_adult(need("adult/adult.data", "adult/adult.test"))
    assert s.x_train.shape == (30162, 104) and s.x_test.shape == (15060, 104)
    assert s.x_train.dtype == np.float32 and s.y_train.dtype == np.int64
    assert np.bincount(s.y_train).tolist() == [22654, 7508]  # <=50K, >50K after dropping '?'
    assert np.bincount(s.y_test).tolist() == [11360, 3700]
    assert s.meta["dropped_rows"] == {"train": 2399, "test": 1221}
    assert len(s.meta["feature_names"]) == 104 and s.meta["feature_names"][0] == "age"
    np.testing.assert_allclose(s.x_train[:, :6].mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(s.x_train[:, :6].std(0), 1.0, atol=1e-3)
    assert np.all(s.x_train[:, 6:].sum(1) == 8)  # one 1 in each of the 8 one-hot blocks
    assert np.all(s.x_test[:, 6:].sum(1) <= 8)
    cfg = validate({"dataset": "adult", "data-dir": str(DATA), "num-clients": 4})
    fed = load_federation(cfg)
    assert [c.num_train for c in fed.clients] == [7541, 7541, 7540, 7540]
