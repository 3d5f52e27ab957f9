"""FedLAP(-DP) client: synthesise a small labelled set S_k whose gradients match
the client's real gradients inside a trust region around the global model
(Wang et al., PoPETS 2024, Alg. 1 / Alg. 3, in the authors' loop order).

S_k holds `fedlap-ipc` images for each class this client holds, with fixed,
balanced labels (never optimised). Initialisation: N(0, 1) noise (the only
choice under DP; then carried over between rounds in the node's
`Context.state`), or, non-DP only, real images of each class
(`fedlap-init = "real"`: this puts raw training images into the first reply
and the server sees them; the authors' non-DP code does it every round,
`fedlap-reinit = true`).

One round, from the global model w_g, learning rate eta_m (cosine over rounds):

    for i in 1..R_i:                       restart from w_g
        for outer in 0..max_outer-1:       while ||w - w_g|| < r (cap 5)
            if ||w - w_g|| >= r: break
            N times:                       one real batch (DP: a DP-SGD gradient)
                seed; g_real = grad CE(w; DSA(x_B, seed))
                R_b times: one SGD step of S_k.x on L_dis(g_real, grad CE(w; DSA(S_k.x, seed)))
            if outer == max_outer-1: break
            R_l times: w <- w - eta_m grad CE(w; DSA(S_k))   (full batch)
    non-DP: r_k = calibrated radius (common/fedlap/trust.py); DP: r_k = r

Privacy (privacy = "dpsgd"): every real gradient is `private_gradient` (Poisson
q = dp-sample-rate, clip dp-clip, noise dp-noise-multiplier); the ledger is
charged BEFORE any data access with the worst case max_outer x R_i x N
sampled-Gaussian steps (`common/privacy/plan.py`), the same entry the server
mirrors. Synthesis, local steps on S_k and server training only read those
noisy gradients (post-processing) and add nothing; the ledger records a
post-processing entry to show it. Radius calibration reads real data, so
under DP it is off and r_k = r.

Reply: an ArrayRecord `fedlap` with `images` (float32 [n, c, h, w]) and
`labels` (uint8 [n]; int64 beyond 255 classes), and a MetricRecord with num-examples, radius, losses.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from client.privacy import charge, locked
from common.fedlap.augment import augment
from common.fedlap.matching import matching_distance
from common.fedlap.trust import calibrate_radius, cosine_lr, param_distance
from common.number_checks import is_real
from common.privacy.events import post_processing
from common.privacy.plan import planned_entries
from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, magnitude_problem
from common.seeding import mechanism_seed, numpy_rng, torch_generator

SET_KEY = "fedlap"          # reply record holding the synthetic set
STATE_KEY = "fedlap-set"    # the node's carried-over set (Context.state)
RADIUS = "fedlap-radius"    # reply metric r_k
LR_KEY = "fedlap-lr"        # eta_m sent by the server (else computed here)


def instructed_lr(config, instruction) -> float:
    """eta_m: the server's (`fedlap-lr`), else this round's on the run's cosine; a finite number > 0."""
    eta = instruction.get(LR_KEY, round_lr(config, int(instruction["server-round"])))
    if not is_real(eta) or not 0 < eta < math.inf:
        raise ValueError(f"the instruction's {LR_KEY} must be a finite number > 0, got {eta!r}")
    return float(eta)


def round_lr(config, server_round: int) -> float:
    """eta_m: `lr` on the authors' cosine over E = fedlap-lr-rounds (0: num-rounds + 1, because the
    authors' FedLAP loop runs rounds 1..E-1, so its last round still has a positive rate)."""
    horizon = int(config["fedlap-lr-rounds"]) or int(config["num-rounds"]) + 1
    return cosine_lr(float(config["lr"]), server_round, horizon)


def initial_set(x: torch.Tensor, y: torch.Tensor, ipc: int, init: str,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """S_k: ipc images for each class in y, labels [c]*ipc in increasing class order."""
    classes = torch.unique(y).tolist()
    labels = torch.tensor([c for c in classes for _ in range(ipc)], dtype=torch.long)
    images = torch.randn((len(labels), *x.shape[1:]), generator=generator)
    if init == "real":
        for i, c in enumerate(classes):
            pool = torch.nonzero(y.cpu() == c).flatten()
            pick = pool[torch.randperm(len(pool), generator=generator)[:ipc]]
            images[i * ipc: i * ipc + len(pick)] = x[pick].detach().cpu()
    return images, labels


def _grads(model, params, x, y, aug_seed, dsa: bool, create_graph: bool = False):
    xa = augment(x, aug_seed) if dsa else x
    loss = F.cross_entropy(model(xa), y)
    return torch.autograd.grad(loss, params, create_graph=create_graph), loss


class _Augmented(torch.nn.Module):
    """model(DSA(x, seed)): lets Opacus compute per-sample gradients of the augmented batch."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.seed, self.dsa = model, 0, True

    def forward(self, x):
        return self.model(augment(x, self.seed) if self.dsa else x)


def synthesise(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, images: torch.Tensor,
               labels: torch.Tensor, *, restarts: int, max_outer: int, real_batches: int, image_steps: int,
               model_steps: int, radius: float, image_lr: float, image_momentum: float, mse_weight: float,
               model_lr: float, dsa: bool, batch_size: int, generator: torch.Generator,
               dp: dict | None = None) -> dict:
    """The FedLAP client loop, in place on `images` (and on the model's weights, which end
    wherever the last trajectory left them: reload w_g before reusing the model).
    `dp`: None, or {sample_rate, max_grad_norm, noise_multiplier, grad_sample_mode} for DP-SGD real gradients.
    Returns counters: real gradient accesses, image steps, model steps, last matching loss."""
    from common.privacy.dpsgd import private_gradient

    params = [p for p in model.parameters() if p.requires_grad]
    global_w = [p.detach().clone() for p in params]
    images.requires_grad_(True)
    opt = torch.optim.SGD([images], lr=image_lr, momentum=image_momentum)
    wrapped = _Augmented(model)
    wrapped.dsa = dsa
    n = len(y)
    accesses = image_updates = steps = 0
    last_match = math.nan
    for _ in range(restarts):
        with torch.no_grad():
            for p, g in zip(params, global_w):
                p.copy_(g)
        for outer in range(max_outer):
            if param_distance(params, global_w) >= radius:
                break
            for _ in range(real_batches):
                # 62 bits: a 31-bit seed repeats within a run (birthday bound at ~10^4 accesses),
                # and a repeated seed repeats a DP access's noise and batch
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
                if dp is None:
                    idx = torch.randperm(n, generator=generator)[:batch_size]  # a uniform batch, no repeats
                    g_real, _ = _grads(model, params, x[idx], y[idx], seed, dsa)
                else:
                    wrapped.seed = seed
                    g_real = private_gradient(wrapped, x, y, seed=seed + 1, **dp)
                g_real = [g.detach() for g in g_real]
                accesses += 1
                for _ in range(image_steps):
                    g_syn, _ = _grads(model, params, images, labels, seed, dsa, create_graph=True)
                    loss = matching_distance(g_real, g_syn, mse_weight)
                    (images.grad,) = torch.autograd.grad(loss, [images])
                    opt.step()
                    image_updates += 1
                    last_match = float(loss.detach())
            if outer == max_outer - 1:
                break
            for _ in range(model_steps):
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
                g, _ = _grads(model, params, images.detach(), labels, seed, dsa)
                with torch.no_grad():
                    torch._foreach_add_(params, [gi.detach() for gi in g], alpha=-model_lr)
                steps += 1
    images.requires_grad_(False)
    return {"accesses": accesses, "image_updates": image_updates, "model_steps": steps,
            "match_loss": last_match}


def fedlap_update(client, content: RecordDict, state: RecordDict) -> RecordDict:
    config, instruction = client.config, content[CONFIG]
    server_round = int(instruction["server-round"])
    private = config["privacy"] == "dpsgd"
    if private:  # the data owner decides: refuse (BudgetExhausted) or record, before any data access
        charge(client.ledger, config, planned_entries(config, instruction), server_run=client.run_id)
    load_arrays(client.model, content[ARRAYS])
    model = client.model
    model.train()
    device = client.x.device
    # Under DP this generator seeds the DP-SGD noise and sampling: secret by default (mechanism_seed).
    root = mechanism_seed(config) if private else int(config["seed"])
    gen = torch_generator(root, "client-fedlap", client.partition, server_round)
    ipc = int(config["fedlap-ipc"])
    carried = state.get(STATE_KEY) if hasattr(state, "get") else None
    if carried is not None and not config["fedlap-reinit"]:
        images = torch.from_numpy(np.array(carried["images"].numpy(), copy=True)).to(device)
        labels = torch.from_numpy(np.array(carried["labels"].numpy(), copy=True)).long().to(device)
    else:
        init_gen = torch_generator(int(config["seed"]), "client-fedlap-init", client.partition,
                                   server_round if config["fedlap-reinit"] else 0)
        images, labels = initial_set(client.x, client.y, ipc, str(config["fedlap-init"]), init_gen)
        images, labels = images.to(device), labels.to(device)
    eta = instructed_lr(config, instruction)
    radius = float(config["fedlap-radius"])
    dp = None
    if private:
        dp = {"sample_rate": float(config["dp-sample-rate"]), "max_grad_norm": float(config["dp-clip"]),
              "noise_multiplier": float(config["dp-noise-multiplier"]),
              "grad_sample_mode": str(config["dp-grad-sample-mode"])}
    counts = synthesise(
        model, client.x, client.y, images, labels,
        restarts=int(config["fedlap-restarts"]), max_outer=int(config["fedlap-max-outer"]),
        real_batches=int(config["fedlap-real-batches"]), image_steps=int(config["fedlap-image-steps"]),
        model_steps=int(config["fedlap-model-steps"]), radius=radius,
        image_lr=float(config["fedlap-image-lr"]), image_momentum=float(config["fedlap-image-momentum"]),
        mse_weight=float(config["fedlap-mse-weight"]), model_lr=eta, dsa=bool(config["fedlap-dsa"]),
        batch_size=int(config["batch-size"]), generator=gen, dp=dp,
    )
    r_k = radius
    if not private and config["fedlap-calibrate"]:
        r_k = calibrate(client, images, labels, content, eta, radius, gen)
    if private:
        with locked(client.ledger) as ledger:  # a read-modify-write of the shared ledger file
            ledger.record(post_processing(round=server_round, note="FedLAP synthesis and local steps on S_k"))
    images_np = images.detach().cpu().numpy().astype(np.float32)
    labels_np = labels.cpu().numpy()
    if magnitude_problem(images_np) is None:
        state[STATE_KEY] = set_record(images_np, labels_np)
    elif STATE_KEY in state:  # diverged, or beyond the server's screen: carried over, it would be sent (and
        del state[STATE_KEY]  # paid for) every later round and dropped every time
    metrics = {NUM_EXAMPLES: client.num_train, RADIUS: float(r_k),
               "match-loss": counts["match_loss"] if math.isfinite(counts["match_loss"]) else -1.0,
               "real-accesses": counts["accesses"]}
    if private:
        delta = float(config["target-delta"])
        metrics["epsilon"] = client.ledger.epsilon(delta, accountant=str(config["accountant"]))
    return RecordDict({SET_KEY: set_record(images_np, labels_np),
                       METRICS: MetricRecord(metrics)})


def set_record(images: np.ndarray, labels: np.ndarray) -> ArrayRecord:
    """The wire form of S_k: float32 images [n, c, h, w] and uint8 labels [n] (int64 beyond 255 classes)."""
    small = labels.size == 0 or (labels.min() >= 0 and labels.max() < 256)  # else uint8 would wrap silently
    return ArrayRecord(OrderedDict([("images", torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))),
                                    ("labels", torch.from_numpy(np.ascontiguousarray(
                                        labels, dtype=np.uint8 if small else np.int64)))]))


def calibrate(client, images, labels, content, eta: float, cap: float, gen: torch.Generator) -> float:
    """Non-DP r_k: train w_g on S_k, read the loss on a fixed real subsample after every step;
    r_k = the distance at the smallest real loss, clipped to r (the authors' rule)."""
    config = client.config
    model = client.model
    load_arrays(model, content[ARRAYS])
    params = [p for p in model.parameters() if p.requires_grad]
    global_w = [p.detach().clone() for p in params]
    rng = numpy_rng(int(config["seed"]), "client-fedlap-calib", client.partition)
    take = min(int(config["fedlap-calib-samples"]), client.num_train)
    sub = torch.as_tensor(rng.choice(client.num_train, size=take, replace=False), device=client.x.device)
    x_sub, y_sub = client.x[sub], client.y[sub]
    dsa = bool(config["fedlap-dsa"])

    def step() -> None:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        g, _ = _grads(model, params, images, labels, seed, dsa)
        with torch.no_grad():
            torch._foreach_add_(params, list(g), alpha=-eta)

    def real_loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(model(x_sub), y_sub))

    r_k = calibrate_radius(step, lambda: param_distance(params, global_w), real_loss,
                           int(config["fedlap-calib-steps"]), cap)
    load_arrays(model, content[ARRAYS])
    return r_k
