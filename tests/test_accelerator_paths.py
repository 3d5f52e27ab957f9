"""Code paths that run differently on an accelerator (device = "cuda" / "mps"), review of session 18.

No GPU here: each test emulates the one property of the accelerator the code path depends on.
"""

from __future__ import annotations

import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from torch.overrides import TorchFunctionMode

import client.updates.perturbation as perturbation
from client.node import LocalClient
from client.updates import update_rule
from common.config import validate
from common.records import ARRAYS, CONFIG, METRICS, model_to_arrays

SMALL = {"dataset": "synthetic", "num-clients": 3, "synthetic-dim": 5, "synthetic-classes": 3, "seed": 3,
         "local-epochs": 1, "lr": 0.05, "momentum": 0.5}

MPS_FLOAT64 = ("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64. "
               "Please use float32 instead.")


class _NoFloat64OnAccelerator(TorchFunctionMode):
    """Tensors marked `_on_mps` behave as MPS tensors do for dtype conversions: float64 is refused
    (Apple's MPS backend has no float64; torch raises this TypeError)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and isinstance(args[0], torch.Tensor) and getattr(args[0], "_on_mps", False):
            to64 = func is torch.Tensor.double or (
                func is torch.Tensor.to and (torch.float64 in args[1:] or kwargs.get("dtype") is torch.float64))
            if to64:
                raise TypeError(MPS_FLOAT64)
        return func(*args, **kwargs)


def test_objective_perturbation_runs_on_an_accelerator_without_float64(tmp_path, monkeypatch):
    """device = "mps" (a config choice; deploy/EDGE-GPU.md advertises it for Apple silicon) with
    privacy = "objective": the noise n lives on the model's device (objective_noise_like moves it there),
    and the rule's `objective-noise-norm` metric must be computable there. MPS has no float64, so a
    float64 conversion of the device tensors raises after the ledger was charged and training ran."""
    real = perturbation.objective_noise_like

    def on_device(params, alpha, generator=None):
        out = real(params, alpha, generator)
        for t in out.values():
            t._on_mps = True  # these are the tensors that sit on the client's accelerator
        return out

    monkeypatch.setattr(perturbation, "objective_noise_like", on_device)
    cfg = validate({**SMALL, "strategy": "fedprox", "privacy": "objective", "objective-alpha": 5.0,
                    "state-dir": str(tmp_path)})
    client = LocalClient(cfg, partition=0)
    content = RecordDict({ARRAYS: model_to_arrays(client.model),
                          CONFIG: ConfigRecord({"server-round": 1, "train-round": 1})})
    with _NoFloat64OnAccelerator():
        reply = update_rule("fedprox", "objective")(client, content, RecordDict())
    assert reply[METRICS]["objective-noise-norm"] > 0


@pytest.mark.parametrize("strategy, extra", [("fedavg", {}), ("fedlap", {"fedlap-dsa": False, "momentum": 0.0})])
def test_server_device_cpu_keeps_the_server_off_a_gpu(tmp_path, monkeypatch, strategy, extra):
    """On a machine with a GPU, device = "cpu" keeps the clients on the CPU, and server-device = "cpu"
    the server's evaluation and FedLAP-DP's server training (run-seed runs are bit-reproducible on the
    CPU only). Emulated: CUDA reports itself available, and any move to it fails (this torch has none)."""
    import json

    from server.inprocess_grid import InProcessGrid
    from server.runner import run_federation

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = validate({**SMALL, "strategy": strategy, "num-rounds": 1, "device": "cpu", "server-device": "cpu",
                    "results-dir": str(tmp_path), "run-name": strategy, "state-dir": str(tmp_path / "state"), **extra})
    with InProcessGrid("client.app:app", dict(cfg), 3) as grid:
        out = run_federation(grid, cfg)
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1
