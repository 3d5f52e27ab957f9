"""FedLAP(-DP) server: train the global model on the union of the clients'
synthetic sets until it has moved by the voted radius r_g (paper Alg. 2 / Eq. 14).

Per round m (learning rate eta_m = cosine over rounds, `common/fedlap/trust.py`):

    w_0 = w_g;  r_g = vote(r_k of the replies)  (min / max / median; fixed: no truncation)
    up to fedlap-server-steps times:
        w <- w - eta_m * sum_k (N_k / N) grad CE(w; DSA(S_k))      (plain SGD, no momentum)
        stop once ||w - w_0|| >= r_g                               (checked after every step)
    a step that crosses r_g ends on it: w <- w_0 + r_g (w - w_0) / ||w - w_0||

The weights N_k/N are the paper's Eq. 14 (with equal N_k it is the authors'
pooled minibatch step). Sets larger than `fedlap-server-batch` contribute a
random minibatch of that size per step. The authors' loop (and Alg. 2) can end
one step outside the trust region; ending on its boundary keeps Eq. 14's
||w - w_0|| <= r_g (to float32 rounding), so no reply, however crafted, moves
the model further (one set at the screen's 1e6 limit moved it 4.7e5 with
r_g = 1). The server only post-processes what the clients released: no
privacy event.

Replies carry images, not models, so they get their own screening
(`set_problem`): shapes, finite values, labels in range, exactly ipc images of
each present class, a radius in [0, r] and a plausible example count. A
bad reply is dropped with a log line, never a crash. Secure aggregation cannot
apply (the server needs the individual sets): `common/config.py` refuses it.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from client.updates.fedlap import LR_KEY, RADIUS, SET_KEY, round_lr
from common.config import ConfigError, resolve_model_name
from common.data import load_federation
from common.fedlap.augment import augment
from common.fedlap.trust import param_distance, vote_radius
from common.models import build_model
from common.number_checks import is_real
from common.records import NUM_EXAMPLES, load_arrays, model_to_arrays
from common.seeding import global_torch_rng, torch_generator
from server.replies import CLIENT_ERROR, DROPPING, examples_problem, magnitude_problem, read_payload
from server.roster import Roster
from server.strategies.fedavg import RosterSampling


def set_problem(msg: Message, *, ipc: int, input_shape: tuple[int, ...], num_classes: int,
                max_examples: int | None, max_radius: float = math.inf) -> str | None:
    """Why a FedLAP reply cannot be used, or None if it can."""
    if msg.has_error():
        return f"{CLIENT_ERROR}{msg.error.reason}"
    content = msg.content
    if SET_KEY not in content or not isinstance(content[SET_KEY], ArrayRecord):
        return f"no synthetic set (ArrayRecord {SET_KEY!r})"
    metrics = [r for r in content.values() if isinstance(r, MetricRecord)]
    if len(metrics) != 1:
        return f"expected one MetricRecord, got {len(metrics)}"
    record, metric = content[SET_KEY], metrics[0]
    if sorted(record.keys()) != ["images", "labels"]:
        return f"set arrays must be 'images' and 'labels', got {sorted(record.keys())}"
    images, labels = read_payload(record["images"]), read_payload(record["labels"])
    for name, values in (("images", images), ("labels", labels)):
        if isinstance(values, str):
            return f"set arrays: {name} {values}"
    if images.dtype != np.float32 or images.ndim != 1 + len(input_shape) or tuple(images.shape[1:]) != input_shape:
        return (f"images have shape {images.shape} ({images.dtype}), expected float32 "
                f"[n, {', '.join(map(str, input_shape))}]")
    problem = magnitude_problem(images)
    if problem:
        return f"images {problem}"
    if labels.dtype.kind not in "iu" or labels.shape != (len(images),):
        return f"labels have shape {labels.shape} ({labels.dtype}), expected [{len(images)}] integers"
    if len(labels) == 0:
        return "empty synthetic set"
    if labels.min() < 0 or labels.max() >= num_classes:
        return f"labels outside 0..{num_classes - 1}"
    classes, counts = np.unique(labels, return_counts=True)
    if (counts != ipc).any():
        return f"expected {ipc} images per class (ipc x classes = {ipc * len(classes)}), got counts {counts.tolist()}"
    radius = metric.get(RADIUS)
    # 0 is honest: calibrate_radius gives 0 when steps on S_k do not move the model (a saturated softmax)
    if not is_real(radius) or not math.isfinite(radius) or radius < 0:
        return f"{RADIUS!r} must be a finite number >= 0, got {radius!r}"
    if radius > max_radius:  # clients clip r_k to r: a larger one is forged (it would steer a max/median vote)
        return f"{RADIUS!r} = {radius!r} exceeds the trust-region radius r = {max_radius!r}"
    return examples_problem(metric, max_examples)


def train_on_sets(model: torch.nn.Module, sets: list[tuple[torch.Tensor, torch.Tensor, float]], *, lr: float,
                  radius: float | None, max_steps: int, batch: int, dsa: bool,
                  generator: torch.Generator) -> tuple[int, float, float]:
    """SGD on sum_k weight_k CE(w; S_k) until ||w - w_0|| >= radius (None: all steps), the step that
    crosses it shortened to end on it. Returns (steps, distance moved, loss before the last step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    model.train()
    steps, loss_value, moved = 0, math.nan, 0.0
    for _ in range(max_steps):
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        loss = params[0].new_zeros(())
        for x, y, weight in sets:
            if len(y) > batch:
                pick = torch.randperm(len(y), generator=generator)[:batch]
                x, y = x[pick], y[pick]
            loss = loss + weight * F.cross_entropy(model(augment(x, seed) if dsa else x), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, list(grads), alpha=-lr)
        steps += 1
        loss_value = float(loss.detach())
        moved = param_distance(params, start)
        if radius is not None and moved >= radius:
            if moved > radius:  # back onto the boundary (a NaN model stays NaN: the runner marks it diverged)
                with torch.no_grad():
                    for p, p0 in zip(params, start):
                        p.copy_(p0 + (p - p0) * (radius / moved))
                moved = param_distance(params, start)
            break
    return steps, moved, loss_value


class FedLap(RosterSampling, FlowerFedAvg):
    """FedLAP server: per-node instructions as FedAvg; aggregation = training on the sets."""

    needs_individual_replies = True

    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *, config):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_available_nodes=len(roster.node_of))
        self.setup_sampling(roster, seed, fraction_train, log)
        self.config = config
        federation = load_federation(config)
        self.input_shape = tuple(federation.input_shape)
        if config["fedlap-dsa"] and len(self.input_shape) != 3:
            raise ConfigError(f"fedlap-dsa = true augments images [c, h, w], but dataset {config['dataset']!r} has "
                              f"inputs of shape {self.input_shape}: set fedlap-dsa = false")
        self.num_classes = int(federation.num_classes)
        name = resolve_model_name(str(config["model"]), str(config["dataset"]))
        from common.evaluation import pick_device

        # the server's own device, as the runner's (server training is the heavy part on a GPU machine)
        self.model = build_model(name, self.input_shape, self.num_classes).to(
            pick_device(str(config["server-device"])))
        self.last_radius: float | None = None

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        out = super().round_config(server_round, config)
        out[LR_KEY] = round_lr(self.config, server_round)
        return out

    def usable(self, replies: Iterable[Message]) -> list[Message]:
        good = []
        for msg in self.from_roster(replies):
            p = self._partition_of.get(msg.metadata.src_node_id)
            problem = set_problem(msg, ipc=int(self.config["fedlap-ipc"]), input_shape=self.input_shape,
                                  num_classes=self.num_classes,
                                  max_examples=None if p is None else self.roster.num_examples[p],
                                  max_radius=float(self.config["fedlap-radius"]))
            if problem:
                self.log(f"{DROPPING} from node {msg.metadata.src_node_id}: {problem}")
            else:
                good.append(msg)
        return good

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good = self.usable(replies)
        if not good or self._sent is None:
            return None, None
        load_arrays(self.model, self._sent)
        device = next(self.model.parameters()).device
        sizes = [float(next(r for r in m.content.values() if isinstance(r, MetricRecord))[NUM_EXAMPLES])
                 for m in good]
        total = sum(sizes)
        sets, radii = [], []
        for msg, n_k in zip(good, sizes):
            record = msg.content[SET_KEY]
            x = torch.from_numpy(np.array(record["images"].numpy(), dtype=np.float32, copy=True)).to(device)
            # astype: any integer dtype the screen let through, in native byte order (torch refuses others)
            y = torch.from_numpy(record["labels"].numpy().astype(np.int64)).to(device)
            sets.append((x, y, n_k / total))
            metric = next(r for r in msg.content.values() if isinstance(r, MetricRecord))
            radii.append(float(metric[RADIUS]))
        rule = str(self.config["fedlap-server-radius"])
        if self.config["privacy"] == "dpsgd" and rule != "fixed":  # Sec. 4.4: no data-dependent r under DP, the
            r_g = float(self.config["fedlap-radius"])  # local radius r; a client's reported one would set it
        else:
            r_g = vote_radius(radii, rule)
        lr = round_lr(self.config, server_round)
        seed = int(self.config["seed"])
        with global_torch_rng(seed, "server-fedlap-global", server_round, device=device):  # dropout masks
            steps, moved, loss = train_on_sets(
                self.model, sets, lr=lr, radius=r_g, max_steps=int(self.config["fedlap-server-steps"]),
                batch=int(self.config["fedlap-server-batch"]), dsa=bool(self.config["fedlap-dsa"]),
                generator=torch_generator(seed, "server-fedlap", server_round))
        # a non-finite model (sets that passed the screen can still overflow a step): the runner marks it diverged
        trained = model_to_arrays(self.model)
        self.last_radius = r_g
        metrics = MetricRecord({"train-loss": loss, "server-steps": steps, "server-moved": moved,
                                "server-radius": -1.0 if r_g is None else r_g, "server-lr": lr,
                                "sets": len(sets)})
        return trained, metrics
