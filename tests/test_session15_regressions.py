"""Regressions found by the review of session 15's own changes (the R_c search, durable writes, the
global-RNG block): each test asserts the behaviour the code had before those changes, or the one its
docstring states."""

from __future__ import annotations

import errno
import math
import os

import pytest

from common.privacy import accounting
from common.privacy.ali import iteration_budget


# --- max_steps under the PLD accountant --------------------------------------------------------------

@pytest.mark.parametrize("sigma", [1e-5, 3e-5])
def test_pld_max_steps_is_zero_when_one_step_already_has_no_finite_epsilon(sigma):
    """epsilon() reports inf where dp-accounting's PLD arithmetic overflows (accounting.epsilon's docstring),
    so R_c is 0 steps, as the previous search returned. `_pld_steps_epsilon` builds the one-step PLD outside
    its ArithmeticError guard: max_steps (and `privfed privacy steps --accountant pld`) raise OverflowError."""
    assert accounting.dpsgd_epsilon(0.01, sigma, 1, 1e-5, accountant="pld") == math.inf
    assert accounting.max_steps(3.0, 1e-5, 0.01, sigma, accountant="pld") == 0
    assert iteration_budget(3.0, 1e-5, 1.0, sigma, accountant="pld") == 0


def test_largest_within_never_probes_the_same_step_count_twice_when_epsilon_overflows():
    """A probe past an overflow (eps = inf) makes the bracket's top infinite; the search then takes k = hi
    ("no line through an overflow") and the Brent safeguard, whose reference step starts at inf, lets it
    through: hi is probed again (twice), which cannot shrink the bracket. Each PLD probe costs up to a second."""
    probes: list[int] = []

    def eps(k: int) -> float:
        probes.append(k)
        return 0.1 * math.sqrt(k) if k <= 1000 else math.inf

    assert accounting.largest_within(eps, 5.0) == 1000
    repeated = sorted({k for k in probes if probes.count(k) > 1})
    assert not repeated, f"probed again: {repeated} (probes {probes})"


# --- durable writes -----------------------------------------------------------------------------------

def test_a_new_ledger_is_written_where_the_file_system_refuses_chmod(tmp_path, monkeypatch):
    """Before this session a ledger (and a checkpoint, summary.json, the lineage tag) was created with
    mkstemp / open and never chmod'ed. write_atomically now fchmods its temp file, and a refused chmod
    (EPERM: a CIFS or vfat share mounted with uid= for another user, whose files the process may create but
    not chmod) fails the write, so no client can charge its ledger and every private run stops. The mode is
    a nicety: the write must not depend on it."""
    from common.privacy.events import dpsgd_steps
    from common.privacy.ledger import PrivacyLedger

    def refused(fd, mode):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "fchmod", refused)
    path = tmp_path / "node-state" / "run-1" / "partition-0.ledger.json"
    ledger = PrivacyLedger.open(path, owner="partition-0")
    ledger.record(dpsgd_steps(0.01, 1.0, 5, round=1))
    assert PrivacyLedger.load(path).steps() == 5


# --- global torch RNG ---------------------------------------------------------------------------------

def test_global_torch_rng_seeds_the_mps_generator_of_an_mps_client(monkeypatch):
    """`device = "mps"` (or `auto` on Apple silicon) trains on MPS, where a model's dropout masks draw from
    the MPS generator. torch.manual_seed, used before this session, seeded it with the (seed, partition,
    round) key every client round; the new block seeds only the CPU generator and CUDA, so an MPS client's
    masks depend on what ran before in the process (other nodes, a resume, the engine), which is what the
    block exists to prevent (client/app.py `checked`)."""
    import torch

    from common.seeding import global_torch_rng, torch_generator

    seeded: list[int] = []
    monkeypatch.setattr(torch.mps, "manual_seed", lambda s: seeded.append(int(s)))
    with global_torch_rng(7, "client-global", 3, 2, device=torch.device("mps")):
        pass
    assert seeded == [torch_generator(7, "client-global", 3, 2).initial_seed()]
