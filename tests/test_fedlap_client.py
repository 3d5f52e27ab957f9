"""FedLAP client loop and an end-to-end in-process run (generated data, no files)."""

import json

import pytest
import torch
import torch.nn.functional as F

from client.updates.fedlap import initial_set, synthesise
from common.config import validate
from common.fedlap.matching import matching_distance

pytestmark = pytest.mark.timeout(300)


def _problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 1, 8, 8, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long() * 3  # labels 0 and 3
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.GroupNorm(4, 4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(256, 5))
    return x, y, model


def test_initial_set_is_balanced_over_the_clients_classes():
    x, y, _ = _problem()
    images, labels = initial_set(x, y, 3, "noise", torch.Generator().manual_seed(1))
    assert images.shape == (6, 1, 8, 8) and labels.tolist() == [0, 0, 0, 3, 3, 3]
    real, _ = initial_set(x, y, 3, "real", torch.Generator().manual_seed(1))
    assert all(any(torch.equal(r, xi) for xi in x[y == labels[i]]) for i, r in enumerate(real))


@pytest.mark.parametrize("dp", [None, {"sample_rate": 0.2, "max_grad_norm": 1.0, "noise_multiplier": 1.0}])
def test_synthesis_counts_accesses_and_improves_matching(dp):
    x, y, model = _problem()
    params = list(model.parameters())
    images, labels = initial_set(x, y, 4, "noise", torch.Generator().manual_seed(2))
    before = images.clone()

    def match():
        g_real = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        g_syn = torch.autograd.grad(F.cross_entropy(model(images), labels), params)
        return float(matching_distance(g_real, g_syn, 0.1))

    start = match()
    counts = synthesise(model, x, y, images, labels, restarts=2, max_outer=3, real_batches=2, image_steps=3,
                        model_steps=1, radius=100.0, image_lr=1.0, image_momentum=0.5, mse_weight=0.1,
                        model_lr=0.0, dsa=True, batch_size=64, generator=torch.Generator().manual_seed(3), dp=dp)
    assert counts["accesses"] == 2 * 3 * 2  # never more than the planned worst case R_i * max_outer * N
    assert counts["image_updates"] == 12 * 3 and counts["model_steps"] == 2 * 2
    assert not torch.equal(images, before) and torch.isfinite(images).all()
    if dp is None:
        assert match() < start


def test_trust_region_stops_early():
    x, y, model = _problem()
    images, labels = initial_set(x, y, 2, "noise", torch.Generator().manual_seed(2))
    counts = synthesise(model, x, y, images, labels, restarts=1, max_outer=5, real_batches=1, image_steps=1,
                        model_steps=3, radius=1e-6, image_lr=1.0, image_momentum=0.0, mse_weight=0.0,
                        model_lr=0.5, dsa=False, batch_size=32, generator=torch.Generator().manual_seed(0))
    assert counts["accesses"] == 1  # after the first model steps the model is outside the radius


def _run(tmp_path, **over):
    from server.inprocess import run_inprocess

    config = validate({"strategy": "fedlap", "dataset": "synthetic", "model": "logreg", "num-clients": 2,
                       "num-rounds": 2, "fedlap-ipc": 2, "fedlap-dsa": False, "fedlap-real-batches": 2,
                       "fedlap-max-outer": 2, "fedlap-image-steps": 2, "fedlap-model-steps": 1,
                       "fedlap-calib-steps": 3, "fedlap-calib-samples": 50, "fedlap-server-steps": 5,
                       "results-dir": str(tmp_path), "run-name": "r", "state-dir": str(tmp_path / "state"),
                       **over})
    run_dir = run_inprocess(config)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_end_to_end_non_dp_counts_uplink_bytes(tmp_path):
    rows = _run(tmp_path)
    assert len(rows) == 2 and all(r["accuracy"] is not None for r in rows)
    assert rows[0]["train_server_steps"] >= 1
    # each reply: ipc x classes images of 60 float32 + uint8 labels + 4 metrics (8 bytes each)
    assert rows[0]["bytes_up"] > 0 and rows[0]["bytes_up"] % 1 == 0
    assert "epsilon_max" not in rows[0]


def test_end_to_end_dp_ledger_has_worst_case_steps(tmp_path):
    rows = _run(tmp_path, privacy="dpsgd", **{"dp-sample-rate": 0.05})
    from common.privacy.events import dpsgd_steps
    from common.privacy.ledger import PrivacyLedger

    ledger = PrivacyLedger([dpsgd_steps(0.05, 1.0, 2 * 2 * 1)] * 2)
    assert rows[-1]["epsilon_max"] == pytest.approx(ledger.epsilon(1e-5), rel=1e-6)
    files = list((tmp_path / "state").rglob("*.ledger.json"))
    assert len(files) == 2
    entries = PrivacyLedger.load(files[0]).entries
    assert [e.kind for e in entries] == ["dpsgd", "post-processing"] * 2
    assert all(e.params["steps"] == 4 for e in entries if e.kind == "dpsgd")


# --- an adversarial review, session 22: each test failed on the code it reviewed ---------------------------
def test_dp_real_gradients_use_the_configured_grad_sample_mode(tmp_path, monkeypatch):
    """dp-grad-sample-mode is read by every privacy = 'dpsgd' client, and validation accepted it for FedLAP-DP,
    but its real gradients always ran Opacus 'hooks'."""
    import common.privacy.dpsgd as dpsgd

    modes, real = [], dpsgd.private_gradient

    def spy(*args, **kwargs):
        modes.append(kwargs["grad_sample_mode"])
        return real(*args, **kwargs)

    monkeypatch.setattr(dpsgd, "private_gradient", spy)
    _run(tmp_path, privacy="dpsgd", **{"dp-sample-rate": 0.05, "dp-grad-sample-mode": "ghost", "num-rounds": 1})
    assert modes and set(modes) == {"ghost"}
