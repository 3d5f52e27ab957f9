"""Datasets and partitioners: `load_federation(config)` builds the federation a run uses.

Dispatch on `config["dataset"]`:

- "synthetic": `synthetic.generate_synthetic` with `num-clients`,
  `synthetic-dim/-classes/-alpha/-beta/-iid` and `seed`; needs no files.
- "syn-iid", "syn-0-0", "syn-0.5-0.5", "syn-1-1": the released Upcycled-FL
  federations (`released.load_released`), split by their own owner column;
  `num-clients` must be 30.
- "mnist", "fashion-mnist", "cifar10", "adult": the dataset's train split is
  cut across `num-clients` clients by `partition` ("iid", "dirichlet" with
  `dirichlet-alpha`, "classes" with `classes-per-client`), with
  `np.random.default_rng(seed)`; the pooled test set is the dataset's test
  split and every client's own test split is empty.
- "adult" with `adult-split = "hu-devices"`: Hu et al.'s IID devices (3052 rows each)
  (`adult_devices.py`), each with its own train / validation / test split.

Files are read from `common.config.resolve_data_dir(config)`; a missing one
raises `DataFileMissing`. Nothing here downloads (see `download.py`).

The federation is cached per process on the config values it depends on, so
the ClientApp can call `load_client` for every message cheaply. The cached
arrays are shared between calls: treat them as read-only.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from common.config import SCHEMA, ConfigError, resolve_data_dir
from common.number_checks import is_int

from . import partition
from .errors import DataFileMissing
from .federation import ClientData, Federation
from .partition import PartitionError
from .released import FILES as RELEASED, NUM_CLIENTS as RELEASED_CLIENTS, load_released
from .splits import Splits
from .synthetic import generate_synthetic

__all__ = [
    "ClientData", "DataFileMissing", "Federation", "PartitionError", "Splits",
    "clear_cache", "generate_synthetic", "load_client", "load_federation", "load_released",
    "load_splits", "load_test_set", "partition",
]

SPLIT_DATASETS = ("mnist", "fashion-mnist", "cifar10", "adult")


def _get(config: Mapping[str, Any], key: str) -> Any:
    return config.get(key, SCHEMA[key].default)


def load_splits(dataset: str, data_dir) -> Splits:
    """Read one of SPLIT_DATASETS' own train/test splits from `data_dir`."""
    if dataset in ("mnist", "fashion-mnist"):
        from .idx import load_idx_dataset
        return load_idx_dataset(dataset, data_dir)
    if dataset == "cifar10":
        from .cifar import load_cifar10
        return load_cifar10(data_dir)
    if dataset == "adult":
        from .adult import load_adult
        return load_adult(data_dir)
    raise ValueError(f"unknown dataset {dataset!r}; readers exist for {', '.join(SPLIT_DATASETS)}")


def _cache_key(config: Mapping[str, Any]) -> tuple:
    """The config values the federation depends on (and nothing else, to keep cache hits)."""
    dataset = str(_get(config, "dataset"))
    num_clients = int(_get(config, "num-clients"))
    seed = int(_get(config, "seed"))
    if dataset == "synthetic":
        return (dataset, num_clients, int(_get(config, "synthetic-dim")),
                int(_get(config, "synthetic-classes")), float(_get(config, "synthetic-alpha")),
                float(_get(config, "synthetic-beta")), bool(_get(config, "synthetic-iid")), seed)
    data_dir = str(resolve_data_dir({"data-dir": _get(config, "data-dir")}))
    if dataset in RELEASED:
        if num_clients != RELEASED_CLIENTS:
            raise ValueError(f"dataset {dataset!r} is a released federation of exactly "
                             f"{RELEASED_CLIENTS} clients; set num-clients = {RELEASED_CLIENTS} "
                             f"(got {num_clients})")
        return (dataset, data_dir)
    if dataset == "adult" and str(_get(config, "adult-split")) == "hu-devices":  # Hu et al.: adult_devices.py
        return ("adult-hu-devices", data_dir, num_clients, seed, str(_get(config, "adult-eval")))
    if dataset in SPLIT_DATASETS:
        how = str(_get(config, "partition"))
        if how == "dirichlet":
            param = float(_get(config, "dirichlet-alpha"))
        elif how == "classes":
            param = int(_get(config, "classes-per-client"))
        elif how == "iid":
            param = None
        else:
            raise ValueError(f"unknown partition {how!r}; expected 'iid', 'dirichlet' or 'classes'")
        return (dataset, data_dir, how, param, num_clients, seed)
    return (dataset, data_dir, num_clients, seed)  # a federation with its own client split (built in _build)


@lru_cache(maxsize=2)
def _build(key: tuple) -> Federation:
    dataset = key[0]
    if dataset == "synthetic":
        _, num_clients, dim, classes, alpha, beta, iid, seed = key
        return generate_synthetic(num_clients, dim, classes, alpha, beta, iid, seed)
    if dataset in RELEASED:
        return load_released(dataset, key[1])
    if dataset == "adult-hu-devices":
        from .adult_devices import load_adult_devices
        _, data_dir, num_clients, seed, evaluate_on = key
        return load_adult_devices(data_dir, num_clients, seed, evaluate_on)
    if dataset not in SPLIT_DATASETS:
        raise ValueError(f"dataset {dataset!r} has no federation: build its own client split in _build, or list "
                         f"its reader in SPLIT_DATASETS (docs/extending.md)")
    _, data_dir, how, param, num_clients, seed = key
    splits = load_splits(dataset, data_dir)
    rng = np.random.default_rng(seed)
    if how == "iid":
        parts = partition.iid(len(splits.y_train), num_clients, rng)
        label = "iid"
    elif how == "dirichlet":
        parts = partition.dirichlet(splits.y_train, num_clients, param, rng)
        label = f"dirichlet(alpha={param:g})"
    else:
        parts = partition.classes(splits.y_train, num_clients, param, rng)
        label = f"classes(k={param})"
    empty_x = np.zeros((0, *splits.input_shape), dtype=splits.x_train.dtype)
    empty_y = np.zeros((0,), dtype=np.int64)
    clients = [ClientData(splits.x_train[idx], splits.y_train[idx], empty_x, empty_y) for idx in parts]
    return Federation(
        clients=clients,
        x_test=splits.x_test,
        y_test=splits.y_test,
        input_shape=splits.input_shape,
        num_classes=splits.num_classes,
        description=f"{dataset}: {len(splits.y_train)} train samples split {label} across "
                    f"{num_clients} clients (seed {seed}); {len(splits.y_test)} test samples",
        meta={**splits.meta, "dataset": dataset, "partition": how, "partition_param": param,
              "seed": seed, "client_sizes": [len(p) for p in parts]},
    )


def load_federation(config: Mapping[str, Any]) -> Federation:
    """The federation `config` describes (cached per process; see the module docstring)."""
    fed = _build(_cache_key(config))
    if fed.num_clients != int(_get(config, "num-clients")):  # clients left out, or partitions with no data
        raise ConfigError(f"the {_get(config, 'dataset')!r} federation has {fed.num_clients} clients; set "
                          f"num-clients = {fed.num_clients} (got {_get(config, 'num-clients')})")
    return fed


def load_client(config: Mapping[str, Any], partition_id: int) -> ClientData:
    """Client `partition_id`'s data (0 <= partition_id < number of clients)."""
    fed = load_federation(config)
    if not is_int(partition_id):
        raise ValueError(f"partition_id must be an int, got {partition_id!r} ({type(partition_id).__name__})")
    if not 0 <= int(partition_id) < fed.num_clients:
        raise ValueError(f"partition_id {partition_id} is out of range: the {_get(config, 'dataset')!r} "
                         f"federation has {fed.num_clients} clients (ids 0..{fed.num_clients - 1}); "
                         f"check num-clients and the SuperNode's partition-id")
    return fed.clients[int(partition_id)]


def load_test_set(config: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The pooled test set (x, y) the server evaluates the global model on."""
    fed = load_federation(config)
    return fed.x_test, fed.y_test


def clear_cache() -> None:
    """Forget cached federations (tests; or to free memory)."""
    _build.cache_clear()
