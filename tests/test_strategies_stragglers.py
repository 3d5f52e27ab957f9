"""Stragglers: who straggles and for how many epochs, drawn from (seed, training round)."""

from collections import Counter

import numpy as np
import pytest

from server.sampling import sample_partitions
from server.stragglers import shortened_epochs, straggler_epochs


def draws(fraction, epochs, rounds=600, seed=3):
    out = []
    for r in range(1, rounds + 1):
        sampled = sample_partitions(seed, r, list(range(30)), 0.3)
        out.append((sampled, straggler_epochs(seed, r, sampled, fraction, epochs)))
    return out


@pytest.mark.parametrize("fraction", [0.3, 0.9])
def test_fraction_of_sampled_clients_straggles(fraction):
    rows = draws(fraction, 10)
    sampled = sum(len(s) for s, _ in rows)
    stragglers = sum(len(d) for _, d in rows)
    assert sampled == 600 * 9
    assert all(set(d) <= set(s) for s, d in rows)  # only sampled clients straggle
    share = stragglers / sampled
    assert abs(share - fraction) < 4 * np.sqrt(fraction * (1 - fraction) / sampled)


def test_epochs_are_floor_u_e_at_least_one_uniform():
    epochs = [e for _, d in draws(0.9, 10) for e in d.values()]
    counts = Counter(epochs)
    assert set(counts) == set(range(1, 10))  # floor(U*10) redrawn while 0: {1..9}
    expected = len(epochs) / 9
    assert all(abs(c - expected) < 5 * np.sqrt(expected) for c in counts.values())


def test_edge_cases():
    assert straggler_epochs(1, 1, [0, 1, 2], 0.0, 10) == {}
    everyone = straggler_epochs(1, 1, [0, 1, 2], 1.0, 10)
    assert sorted(everyone) == [0, 1, 2] and all(1 <= e <= 9 for e in everyone.values())
    assert set(straggler_epochs(1, 1, list(range(20)), 1.0, 1).values()) == {1}  # E = 1: nothing shorter
    assert shortened_epochs(np.random.default_rng(0), 2) == 1


def test_draws_depend_on_seed_and_training_round_only():
    a = straggler_epochs(5, 7, [1, 4, 9], 0.5, 10)
    assert a == straggler_epochs(5, 7, [1, 4, 9], 0.5, 10)
    # a client's draw does not depend on who else was sampled
    assert {p: e for p, e in straggler_epochs(5, 7, [1, 2, 4, 9, 11], 0.5, 10).items() if p in a} == a
    assert any(straggler_epochs(5, r, list(range(30)), 0.5, 10) != straggler_epochs(5, 7, list(range(30)), 0.5, 10)
               for r in (8, 9))
