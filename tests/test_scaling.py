"""What must not grow with the length or the size of a run (a scaling review, session 12): the PLD
loss grid of many composed Gaussian releases, and the models a client process keeps. Each test asserts
a count or a size, never a wall time. The costs that still grow are listed in the README (Engines).
"""

from __future__ import annotations

import math

from common.privacy import accounting
from common.privacy.events import output_perturbation_release
from common.privacy.ledger import PrivacyLedger

DELTA = 1e-5


def test_pld_of_many_gaussian_releases_keeps_its_loss_grid_within_pld_max_points(monkeypatch):
    """accounting.PLD_MAX_POINTS bounded the loss grid of ONE Gaussian (pld_interval used the smallest
    per-release noise multiplier), but dp-accounting composes SelfComposed(Gaussian(z), n) as one Gaussian
    of std z / sqrt(n), whose loss range grows n-fold, on the same interval: 20 releases of the default
    clip (10) at std 4 under the 'ball' rule (z = 0.2) ask for a ~2.3M-point grid; 40 releases at the
    default std 1 (z = 0.05, an 80-round Upcycled run) took 18 s and 2.4 GB peak RSS in this review (one
    release: 0.7 s, 200 MB), and the run summary computes this PLD line for every distinct ledger whatever
    the run's accountant (with accountant = 'pld', every round does)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_module

    real = pld_module.from_gaussian_mechanism
    grids: list[float] = []

    def guarded(*args, **kwargs):
        sd, interval = kwargs["standard_deviation"], kwargs["value_discretization_interval"]
        points = (1 / (2 * sd * sd) + 10 / sd) / interval  # the loss span pld_interval budgets for
        grids.append(points)
        assert points <= accounting.PLD_MAX_POINTS * 1.05, (
            f"a Gaussian PLD of std {sd:.4g} on interval {interval:.3g}: ~{points:,.0f} grid points, "
            f"more than PLD_MAX_POINTS = {accounting.PLD_MAX_POINTS:,}")
        return real(*args, **kwargs)

    monkeypatch.setattr(pld_module, "from_gaussian_mechanism", guarded)
    accounting._pld_epsilon.cache_clear()
    try:
        ledger = PrivacyLedger([output_perturbation_release(10.0, 4.0, 500, rule="ball", round=2 * m + 1)
                                for m in range(20)])
        eps = ledger.epsilon(DELTA, accountant="pld")
    finally:
        accounting._pld_epsilon.cache_clear()
    assert grids, "the PLD accountant was never asked for the Gaussian releases"
    assert math.isfinite(eps) and eps > 0


def live_parameter_bytes() -> int:
    import gc

    import torch

    gc.collect()
    return sum(o.numel() * o.element_size() for o in gc.get_objects() if isinstance(o, torch.nn.Parameter))


def test_a_client_process_keeps_one_model_not_one_per_partition(tmp_path):
    """client.node.local_client cached a LocalClient per partition, each with its OWN model, and the
    enrollment query touches every partition: the in-process engine, and every Flower simulation actor
    over time, hold num-clients models although each instruction overwrites the weights first
    (load_arrays). ali-cifar-cnn (550,570 parameters): 220 MB per process for 100 clients, 1.1 GB for
    500 (4 MB / 2 GB at 1e6 parameters), on the run's device. One model per (run, process) suffices."""
    import io

    from rich.console import Console

    import client.node
    from common.config import validate
    from common.data import load_federation
    from common.models import build_model
    from server.inprocess import run_inprocess

    clients = 8
    cfg = validate({"num-clients": clients, "num-rounds": 1, "strategy": "fedavg", "fraction-train": 0.25,
                    "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state")})
    federation = load_federation(cfg)
    model_bytes = sum(p.numel() * p.element_size()
                      for p in build_model("logreg", federation.input_shape, federation.num_classes).parameters())
    client.node._local.clear()
    before = live_parameter_bytes()
    run_inprocess(cfg, console=Console(file=io.StringIO()), threads=1)
    held = live_parameter_bytes() - before
    client.node._local.clear()
    assert held <= 2 * model_bytes, (f"after a {clients}-client run the process holds {held} bytes of model "
                                     f"parameters; one model is {model_bytes} bytes")
