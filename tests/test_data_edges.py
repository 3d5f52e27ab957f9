"""Data-layer edges found by a review (session 13): tiny Dirichlet alphas, keys a split ignores,
malformed released arrays."""

from __future__ import annotations

import numpy as np
import pytest

from common.config import ConfigError, validate
from common.data import clear_cache, generate_synthetic, load_federation, partition
from tests.conftest import data_dir_or_skip


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def _cap_violations(parts, labels, num_clients):
    """(label, client, held before, received) for every class dealt to a client already at n/K samples
    (beyond the single leftover sample that floor(cumsum(p) * n_c) can hand the last client).

    Replays the deal in the partitioner's class order (np.unique) from the per-class counts."""
    values = np.unique(labels)
    per_class = np.array([[np.sum(labels[p] == c) for c in values] for p in parts])
    cap = len(labels) / num_clients
    held = np.zeros(num_clients, dtype=np.int64)
    bad = []
    for j, c in enumerate(values):
        for k in range(num_clients):
            if held[k] >= cap and per_class[k, j] > 1:  # 1: floor(cumsum) rounding leftover, as the authors'
                bad.append((int(c), k, int(held[k]), int(per_class[k, j])))
        held += per_class[:, j]
    return bad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_tiny_alpha_never_deals_to_clients_already_at_the_cap(seed):
    """partition.py's docstring: 'While a class is dealt out, clients already holding >= n/K samples get
    no more'. With a tiny alpha the Dirichlet mass can fall entirely on capped clients (the uncapped
    proportions underflow to exactly 0); the class must then still go to uncapped clients only, not be
    spread evenly over all K clients (which also turns that class IID: the opposite of alpha -> 0)."""
    labels = np.repeat(np.arange(10), 100)  # 10 classes x 100, n = 1000, K = 10: cap = 100
    parts = partition.dirichlet(labels, 10, 1e-6, np.random.default_rng(seed))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    assert _cap_violations(parts, labels, 10) == []


def test_dirichlet_tiny_alpha_never_splits_a_class_evenly_over_every_client():
    """Same defect seen from the skew side: at alpha = 1e-6 no class should be held by all 10 clients."""
    labels = np.repeat(np.arange(10), 100)
    parts = partition.dirichlet(labels, 10, 1e-6, np.random.default_rng(0))
    holders = [sum(int(np.any(labels[p] == c)) for p in parts) for c in range(10)]
    assert max(holders) < 10, f"holders per class: {holders}"


def test_hu_devices_does_not_silently_ignore_a_requested_label_skew_partition():
    """adult-split = 'hu-devices' deals IID devices and never reads `partition`. A run asking for
    partition = 'dirichlet' (alpha 0.05) must be refused at validation (as _check_ignored_keys does for
    other keys a run would ignore), or get the label skew it asked for; today it silently gets IID data
    while its resolved config says dirichlet."""
    data_dir = data_dir_or_skip("adult", "adult.data")
    raw = {"dataset": "adult", "adult-split": "hu-devices", "num-clients": 16, "partition": "dirichlet",
           "dirichlet-alpha": 0.05, "data-dir": str(data_dir)}
    try:
        config = validate(raw)
    except ConfigError:
        return  # refused: fine
    fed = load_federation(config)
    positive = [float(c.y_train.mean()) for c in fed.clients]
    assert max(positive) - min(positive) > 0.3, f"positive-label fraction per device: {positive}"


def _write_released(data_dir, **change):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.normal(size=(90, 20)), "y_train": rng.integers(0, 2, 90),
              "client_train": np.repeat(np.arange(30), 3), "x_test": rng.normal(size=(30, 20)),
              "y_test": rng.integers(0, 2, 30), "client_test": np.arange(30)}
    arrays.update(change)
    folder = data_dir / "fedprox-synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "syn_iid.npz", **arrays)
    return folder / "syn_iid.npz"


@pytest.mark.parametrize("key", ["y_train", "client_train", "y_test"])
def test_released_column_vector_labels_or_owners_are_refused_as_damaged(tmp_path, key):
    """released.py promises (n, 20), (n,), (n,) arrays and DataFileCorrupt for anything else, but checks
    only len(): a y of shape (n, 1) (a common torch -> numpy export) loads and hands every client 2-d
    labels that crash later inside torch's cross_entropy; an owner column of shape (n, 1) raises a bare
    ValueError from partition.natural that does not name the file."""
    from common.data.errors import DataFileCorrupt
    from common.data.released import load_released

    n = 30 if key.endswith("test") else 90
    column = {"y_train": np.random.default_rng(0).integers(0, 2, 90), "y_test": np.zeros(30, dtype=np.int64),
              "client_train": np.repeat(np.arange(30), 3)}[key]
    path = _write_released(tmp_path, **{key: column.reshape(n, 1)})
    with pytest.raises(DataFileCorrupt) as info:
        load_released("syn-iid", tmp_path)
    assert str(path) in str(info.value)


def test_an_interrupted_download_leaves_no_file_that_counts_as_present(tmp_path):
    """The file is written beside its name and renamed: a crash mid-write leaves neither a truncated file
    (which `_present` would count as downloaded) nor the partial temp file."""
    from common.durable import write_atomically  # what common/data/download.py writes each file with

    dest = tmp_path / "adult.data"

    def interrupted(fh):
        fh.write(b"39, State-gov, 77516")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(dest, interrupted)
    assert list(tmp_path.iterdir()) == []
    write_atomically(dest, lambda fh: fh.write(b"whole"))
    assert dest.read_bytes() == b"whole" and list(tmp_path.iterdir()) == [dest]


# --- review of session 18 ---

@pytest.mark.parametrize("dataset, clients", [("synthetic", 10), ("syn-0.5-0.5", 30), ("syn-iid", 30)])
def test_synthetic_federations_refuse_a_label_skew_partition_they_would_ignore(dataset, clients):
    """`synthetic` and the released `syn-*` federations are always split by their own owner column
    (common/data/__init__.py `_build` never reads `partition` for them). A run asking for
    partition = 'dirichlet' (alpha 0.05) or 'classes' must be refused at validation, exactly as
    `_check_ignored_keys` already refuses it for adult-split = 'hu-devices' ("Refuse a key that the run's
    local rule would silently ignore: the run would not be the one asked for"). Today validate accepts it
    and the resolved config (recorded in the run's summary) says 'dirichlet' for an unskewed run."""
    for how, extra in (("dirichlet", {"dirichlet-alpha": 0.05}), ("classes", {"classes-per-client": 1})):
        raw = {"dataset": dataset, "num-clients": clients, "partition": how, **extra}
        if dataset.startswith("syn-"):
            raw["data-dir"] = str(data_dir_or_skip("fedprox-synthetic"))
        with pytest.raises(ConfigError):
            config = validate(raw)
            # Not refused: it must then at least be what was asked for, which it never is.
            fed = load_federation(config)
            assert fed.meta.get("partition") == how, (
                f"{dataset}: validate accepted partition = {how!r} but the federation was split "
                f"{fed.meta.get('partition', 'by its generator')!r}")


# --- an adversarial review, session 21: each test failed on the code it reviewed ----------------------------
def test_synthetic_generator_refuses_non_finite_alpha_or_beta():
    """generate_synthetic's _check says alpha and beta must be >= 0 but lets inf through: beta = inf
    returns all -inf/+inf features, alpha = inf collapses every label to class 0 (contradicting the
    module's own 'labels do not depend on alpha')."""
    with pytest.raises(ValueError):
        generate_synthetic(3, dim=5, classes=3, alpha=0.0, beta=float("inf"), seed=1)
    with pytest.raises(ValueError):
        generate_synthetic(3, dim=5, classes=3, alpha=float("inf"), beta=0.0, seed=1)


def test_impossible_dirichlet_split_names_only_settings_a_user_can_change():
    """Through a run config, an impossible Dirichlet split tells the user to use 'a smaller min_size',
    which is no config key (min_size is fixed at 10 in _build): the one-line error names a fix that
    cannot be applied."""
    config = {"dataset": "adult", "partition": "dirichlet", "dirichlet-alpha": 0.01, "num-clients": 100,
              "seed": 0, "data-dir": str(data_dir_or_skip("adult", "adult.data"))}
    with pytest.raises(ValueError) as info:
        load_federation(config)
    msg = str(info.value)
    assert "dirichlet-alpha" in msg
    assert "min_size" not in msg
