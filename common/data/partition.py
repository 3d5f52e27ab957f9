"""Partitioners: split a dataset's sample indices across clients.

Pure functions on label (or owner) arrays. Each returns a list with one int64
index array per client; together the arrays are disjoint and complete (every
index 0..n-1 appears exactly once). Each client's indices are in increasing
order except for `iid`, whose are in random order. Randomness comes only from
the `numpy.random.Generator` passed in, so a seeded generator gives the same
split everywhere.

- `iid`: a random permutation cut into near-equal parts (sizes differ by <= 1).
- `dirichlet`: label skew. For each class c, a proportion vector
  p_c ~ Dirichlet(alpha * 1_K) splits the class's samples across the K clients
  (smaller alpha: more skew). While a class is dealt out, clients already
  holding >= n/K samples get no more, which keeps client sizes bounded (the
  usual rule of the NIID-Bench-style partition). The whole draw is repeated
  until every client has >= `min_size` samples, at most `max_tries` times,
  then `PartitionError` says what to change.
- `classes`: each client holds exactly k labels. Labels are dealt so that every
  label has at least one holder (hence the split is complete) and the numbers
  of holders per label differ by at most one; each label's samples are then cut
  into near-equal random shards, one per holder. With num_clients * k equal to
  the number of labels, the clients' label sets are disjoint (5 clients x 2 of
  10 labels: a random pairing of the labels).
- `natural`: one client per distinct owner value (in sorted order), for data
  that come with their own owner column.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from common.config import ConfigError


class PartitionError(ConfigError):
    """The requested partition cannot be made (too few samples, labels or tries).

    A ConfigError (so a ValueError): num-clients or the partition's parameter does
    not fit the data, and `privfed run` reports it in one line, not a traceback."""


def _as_labels(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-d array, got shape {labels.shape}")
    return labels


def _check_clients(num_clients: int, n: int) -> int:
    num_clients = int(num_clients)
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if n < num_clients:
        raise PartitionError(f"cannot split {n} samples across {num_clients} clients: fewer samples than clients")
    return num_clients


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle 0..n-1 and cut it into `num_clients` parts whose sizes differ by at most one."""
    num_clients = _check_clients(num_clients, int(n))
    perm = rng.permutation(int(n)).astype(np.int64)
    return [part.copy() for part in np.array_split(perm, num_clients)]


def dirichlet(
    labels: Sequence[int] | np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Label-skewed split: class c's samples go to clients in proportions p_c ~ Dir(alpha).

    Redraws the whole split until every client has at least `min_size`
    samples; after `max_tries` draws raises PartitionError.
    """
    labels = _as_labels(labels)
    n = len(labels)
    num_clients = _check_clients(num_clients, n)
    if not alpha > 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    if min_size * num_clients > n:
        raise PartitionError(
            f"dirichlet partition cannot give each of {num_clients} clients >= {min_size} samples out of {n}; "
            f"use fewer clients"
        )
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    cap = n / num_clients
    smallest = 0
    for _ in range(max(1, int(max_tries))):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        counts = np.zeros(num_clients, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            open_ = counts < cap  # never empty before the last sample is dealt
            p = np.where(open_, p, 0.0)
            total = p.sum()
            # a tiny alpha can underflow every open client's share to 0: split among the open ones only
            p = p / total if total > 0 else open_ / open_.sum()
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
                counts[k] += len(piece)
        smallest = int(counts.min())
        if smallest >= min_size:
            return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    raise PartitionError(
        f"dirichlet partition with alpha={alpha} over {num_clients} clients left some client with "
        f"fewer than {min_size} samples in each of {max_tries} draws (last smallest: {smallest}); "
        f"use a larger dirichlet-alpha or fewer clients (num-clients)"
    )


def _deal_labels(
    label_values: np.ndarray, num_clients: int, k: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Give each client k distinct labels, every label >= 1 holder, holder counts within 1."""
    holders = np.zeros(len(label_values), dtype=np.int64)
    dealt = []
    for _ in range(num_clients):
        # The k labels with the fewest holders so far; random among ties.
        order = np.lexsort((rng.random(len(label_values)), holders))
        chosen = np.sort(order[:k])
        holders[chosen] += 1
        dealt.append(chosen)
    return dealt


def classes(
    labels: Sequence[int] | np.ndarray, num_clients: int, k: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client holds exactly k labels; each label's samples are shared among its holders.

    Needs k <= number of labels <= num_clients * k (so that every label has a
    holder and the split is complete), else PartitionError.
    """
    labels = _as_labels(labels)
    n = len(labels)
    num_clients = _check_clients(num_clients, n)
    k = int(k)
    values = np.unique(labels)
    if k < 1:
        raise ValueError(f"classes per client must be >= 1, got {k}")
    if k > len(values):
        raise PartitionError(f"cannot give each client {k} labels: the data have only {len(values)}")
    if num_clients * k < len(values):
        raise PartitionError(
            f"{num_clients} clients x {k} labels each cover at most {num_clients * k} of the "
            f"{len(values)} labels; some data would belong to no client. "
            f"Use more clients or more classes per client (>= {-(-len(values) // num_clients)})"
        )
    dealt = _deal_labels(values, num_clients, k, rng)
    holders_of: list[list[int]] = [[] for _ in values]
    for client, chosen in enumerate(dealt):
        for c in chosen:
            holders_of[c].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, value in enumerate(values):
        idx = rng.permutation(np.flatnonzero(labels == value))
        who = holders_of[c]
        if len(idx) < len(who):
            raise PartitionError(
                f"label {value!r} has {len(idx)} samples but {len(who)} clients to share it"
            )
        for client, shard in zip(who, np.array_split(idx, len(who))):
            parts[client].append(shard)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def natural(owner: Sequence[int] | np.ndarray) -> list[np.ndarray]:
    """One client per distinct value of `owner`, in sorted order of the values."""
    owner = _as_labels(owner)
    return [np.flatnonzero(owner == v).astype(np.int64) for v in np.unique(owner)]
