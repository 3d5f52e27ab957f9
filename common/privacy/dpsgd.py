"""DP-SGD local training through Opacus.

One DP-SGD step (Abadi et al. 2016, with Poisson sampling as accounted by the
sampled Gaussian mechanism):

1. Poisson-sample a batch B: every local record independently with probability
   q (Opacus `UniformWithReplacementSampler`, which despite its name is Poisson
   sampling). B may be empty.
2. Per-sample gradients g_i (Opacus `GradSampleModule`, mode `hooks`,
   `functorch` or `ew`), each clipped to L2 norm C over all parameters together.
   Mode `ghost` (Opacus' ghost clipping) computes only the per-sample norms and
   then the clipped sum by a second, reweighted backward pass, never
   materialising the per-sample gradients: the same step, much faster for
   large batches of small linear/ReLU models (Hu et al.'s full-batch MLP).
3. g = (sum_i clip(g_i) + N(0, sigma^2 C^2 I)) / (q |D|): Opacus `DPOptimizer`
   with `expected_batch_size = q |D|`. We divide by the *expected* batch size,
   not the realised |B|: the divisor is then data-independent, so the step is
   exactly the mechanism the accountant analyses (add/remove one record). An
   empty batch still takes a step of pure noise, as the analysis assumes.
   (ALI-DPFL's paper divides by |B|, its code by a constant; FedLAP's code uses
   Opacus 0.15 with the expected size.)
4. w <- SGD(w, g) with learning rate, momentum and weight decay; weight decay
   and `regularizer` gradients (data-independent, e.g. a FedProx term or the
   objective-perturbation term <n, w>) are added after the noise, which is
   post-processing.

Each step is `events.dpsgd_steps(q, sigma, 1)` in the ledger; `dpsgd_train`
returns the number of steps taken so that the caller records exactly those.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from opacus.grad_sample import GradSampleModule, GradSampleModuleExpandedWeights, GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from opacus.validators import ModuleValidator
from torch import nn

GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "ghost")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Regularizer = Callable[[nn.Module], torch.Tensor]


class IncompatibleModelError(ValueError):
    """The model has layers DP-SGD cannot train (e.g. BatchNorm mixes samples)."""


def check_model(model: nn.Module) -> None:
    """Raise IncompatibleModelError (listing every offending layer) unless Opacus
    can compute per-sample gradients for `model`."""
    was_training = model.training
    model.train()  # Opacus validates the training-mode model (e.g. BatchNorm running stats)
    try:
        errors = ModuleValidator.validate(model, strict=False)
    finally:
        model.train(was_training)
    if errors:
        lines = "\n".join(f"  - {e}" for e in errors)
        raise IncompatibleModelError(
            f"model {type(model).__name__} cannot be trained with DP-SGD:\n{lines}\n"
            "Build it with layers Opacus supports (e.g. GroupNorm instead of BatchNorm), or call "
            "common.privacy.dpsgd.make_dp_compatible(model) once when the model is built."
        )


def make_dp_compatible(model: nn.Module) -> nn.Module:
    """A copy of `model` with incompatible layers replaced (Opacus
    `ModuleValidator.fix`: BatchNorm -> GroupNorm, ...). Returns a new module:
    use it in place of the original from then on."""
    fixed = ModuleValidator.fix(model)
    check_model(fixed)
    return fixed


@dataclass(frozen=True)
class DpSgdResult:
    """`steps`: DP-SGD steps taken (record exactly these in the ledger).
    `mean_loss`: mean over non-empty batches of the batch's mean training loss
    (not privatised; nan if every batch was empty). `empty_batches`: steps whose
    Poisson batch was empty (noise-only steps). `mean_batch_size`: realised."""

    steps: int
    mean_loss: float
    empty_batches: int
    mean_batch_size: float


class DpSgd:
    """DP-SGD on one model: wraps it for per-sample gradients and wraps an SGD
    optimizer in Opacus' DPOptimizer. `step(xb, yb)` takes one step on a batch the
    caller sampled (use `dpsgd_train` for Poisson sampling). Use as a context
    manager, or call `close()`: that removes the Opacus hooks and attributes, so
    the caller's model object is left with the trained weights only."""

    def __init__(self, model: nn.Module, *, dataset_size: int, sample_rate: float, max_grad_norm: float,
                 noise_multiplier: float, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 grad_sample_mode: str = "hooks", noise_generator: torch.Generator | None = None,
                 loss_fn: LossFn | None = None, regularizer: Regularizer | None = None):
        if grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise ValueError(f"unknown grad_sample_mode {grad_sample_mode!r}; known: {', '.join(GRAD_SAMPLE_MODES)}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample rate q must be in (0, 1]; got {sample_rate}")
        if dataset_size <= 0:
            raise ValueError(f"dataset size must be positive; got {dataset_size}")
        if not max_grad_norm > 0:
            raise ValueError(f"clipping norm C must be positive; got {max_grad_norm}")
        if not noise_multiplier >= 0:
            raise ValueError(f"noise multiplier must be non-negative; got {noise_multiplier}")
        check_model(model)
        self.model = model
        self.expected_batch_size = sample_rate * dataset_size
        self.loss_fn: LossFn = loss_fn or nn.functional.cross_entropy
        self.regularizer = regularizer
        self._was_training = model.training
        self.params = [p for p in model.parameters() if p.requires_grad]
        sgd = torch.optim.SGD(self.params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        dp_args = dict(noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
                       expected_batch_size=self.expected_batch_size, loss_reduction="mean", generator=noise_generator)
        self._ghost_loss = None
        if grad_sample_mode == "ghost":
            if loss_fn is not None:
                raise ValueError("grad_sample_mode 'ghost' supports the default cross-entropy loss only")
            self.gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="mean",
                                                            max_grad_norm=max_grad_norm, use_ghost_clipping=True)
            self.optimizer = DPOptimizerFastGradientClipping(sgd, **dp_args)
            self._ghost_loss = DPLossFastGradientClipping(self.gsm, self.optimizer, nn.CrossEntropyLoss())
        else:
            if grad_sample_mode == "ew":
                self.gsm = GradSampleModuleExpandedWeights(model, batch_first=True, loss_reduction="mean")
            else:
                self.gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=True,
                                            force_functorch=grad_sample_mode == "functorch")
            self.optimizer = DPOptimizer(sgd, **dp_args)
        self._closed = False
        model.train()

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> float | None:
        """One DP-SGD step on batch (xb, yb); returns its mean loss (None if empty)."""
        if self._closed:
            raise RuntimeError("this DpSgd has been closed")
        self.optimizer.zero_grad(set_to_none=True)
        loss_value: float | None = None
        if len(xb) == 0:
            for p in self.params:  # no samples: the clipped sum is zero, add_noise adds noise
                if self._ghost_loss is None:
                    p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
                else:
                    p.grad = torch.zeros_like(p)
        else:
            self._zero_unreached(len(xb), before_backward=True)
            with warnings.catch_warnings():
                # Opacus' hooks on a first layer whose input needs no gradient: harmless.
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss = (self._ghost_loss or self.loss_fn)(self.gsm(xb), yb)
                loss.backward()  # ghost: two passes, p.grad = the clipped sum
            self._zero_unreached(len(xb), before_backward=False)
            loss_value = float(loss.detach())
        if self.optimizer.pre_step():  # clip, sum, noise, divide by q|D|
            if self.regularizer is not None:
                reg = self.regularizer(self.model)
                grads = torch.autograd.grad(reg, self.params, allow_unused=True)
                for p, g in zip(self.params, grads):
                    if g is not None:
                        p.grad.add_(g)
            self.optimizer.original_optimizer.step()
        return loss_value

    def _zero_unreached(self, batch: int, before_backward: bool) -> None:
        """A trainable parameter the forward pass does not reach (an unused head) has gradient zero for
        every sample; Opacus would stop at it ("Per sample gradient is not initialized"). Ghost clipping
        reads per-sample norms, which the backward hooks overwrite for the parameters they reach."""
        for p in self.params:
            if self._ghost_loss is not None:
                if before_backward:
                    p._norm_sample = torch.zeros(batch, dtype=p.dtype, device=p.device)
                elif p.grad is None:
                    p.grad = torch.zeros_like(p)
            elif not before_backward and p.grad_sample is None:
                p.grad_sample = torch.zeros((batch, *p.shape), dtype=p.dtype, device=p.device)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.optimizer.zero_grad(set_to_none=True)
        self.gsm.cleanup()  # removes hooks and grad_sample / _forward_counter / ...
        for p in self.model.parameters():
            for attr in ("summed_grad", "grad_sample", "_forward_counter", "_current_grad_sample", "_norm_sample"):
                if hasattr(p, attr):
                    delattr(p, attr)
            p.grad = None
        self.model.train(self._was_training)

    def __enter__(self) -> "DpSgd":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _generators(seed: int | None, generator: torch.Generator | None, device: torch.device):
    if generator is not None:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    if seed is None:
        return None, None
    sampling = torch.Generator().manual_seed(int(seed))
    noise = torch.Generator(device=device).manual_seed((int(seed) * 7919 + 1) % (2**63))
    return sampling, noise


def dpsgd_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, sample_rate: float,
                max_grad_norm: float, noise_multiplier: float, lr: float, momentum: float = 0.0,
                weight_decay: float = 0.0, seed: int | None = None, generator: torch.Generator | None = None,
                device: str | torch.device | None = None, grad_sample_mode: str = "hooks",
                loss_fn: LossFn | None = None, regularizer: Regularizer | None = None) -> DpSgdResult:
    """Run exactly `steps` DP-SGD steps on the local data (x, y), in place on `model`.

    q = `sample_rate` (Poisson), C = `max_grad_norm`, sigma = `noise_multiplier`;
    the step divides by the expected batch size q*|D| (module docstring).
    Randomness (sampling and noise) comes from `seed`, or from a seed drawn from
    `generator`; with neither, from torch's global RNG. `device`: where to train
    (default: where the model is); the model stays there. Momentum starts from
    zero on every call. Privacy cost: `events.dpsgd_steps(q, sigma, result.steps)`.
    """
    if steps < 0:
        raise ValueError(f"steps must be non-negative; got {steps}")
    n = len(x)
    if n == 0 or len(y) != n:
        raise ValueError(f"need a non-empty dataset with one label per example; got {len(x)} inputs, {len(y)} labels")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(dev)
    sampling_gen, noise_gen = _generators(seed, generator, dev)
    sampler = UniformWithReplacementSampler(num_samples=n, sample_rate=sample_rate, generator=sampling_gen,
                                            steps=steps)
    losses: list[float] = []
    empty = 0
    batch_total = 0
    with DpSgd(model, dataset_size=n, sample_rate=sample_rate, max_grad_norm=max_grad_norm,
               noise_multiplier=noise_multiplier, lr=lr, momentum=momentum, weight_decay=weight_decay,
               grad_sample_mode=grad_sample_mode, noise_generator=noise_gen, loss_fn=loss_fn,
               regularizer=regularizer) as trainer:
        taken = 0
        for indices in sampler:
            idx = torch.as_tensor(indices, dtype=torch.long)
            batch_total += len(idx)
            loss = trainer.step(x[idx].to(dev), y[idx].to(dev))
            if loss is None:
                empty += 1
            else:
                losses.append(loss)
            taken += 1
    mean_loss = math.fsum(losses) / len(losses) if losses else float("nan")
    return DpSgdResult(steps=taken, mean_loss=mean_loss, empty_batches=empty,
                       mean_batch_size=batch_total / taken if taken else 0.0)


def private_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, sample_rate: float,
                     max_grad_norm: float, noise_multiplier: float, seed: int | None = None,
                     generator: torch.Generator | None = None, grad_sample_mode: str = "hooks",
                     loss_fn: LossFn | None = None) -> list[torch.Tensor]:
    """One sampled Gaussian mechanism on the gradient, without a step:
    (sum over a Poisson batch of clipped per-sample gradients + N(0, sigma^2 C^2 I)) / (q|D|),
    one tensor per trainable parameter (FedLAP-DP's matching target). The model
    is not changed. Privacy cost: `events.dpsgd_steps(q, sigma, 1)`."""
    n = len(x)
    if n == 0 or len(y) != n:
        raise ValueError("need a non-empty dataset with one label per example")
    dev = next(model.parameters()).device
    sampling_gen, noise_gen = _generators(seed, generator, dev)
    (indices,) = list(UniformWithReplacementSampler(num_samples=n, sample_rate=sample_rate,
                                                    generator=sampling_gen, steps=1))
    idx = torch.as_tensor(indices, dtype=torch.long)
    before = [p.detach().clone() for p in model.parameters()]
    grads: list[torch.Tensor] = []

    def capture(trainer: DpSgd) -> None:
        grads.extend(p.grad.detach().clone() for p in trainer.params)

    # lr = 0: the optimizer step leaves the weights as they are.
    with DpSgd(model, dataset_size=n, sample_rate=sample_rate, max_grad_norm=max_grad_norm,
               noise_multiplier=noise_multiplier, lr=0.0, grad_sample_mode=grad_sample_mode,
               noise_generator=noise_gen, loss_fn=loss_fn) as trainer:
        trainer.optimizer.attach_step_hook(lambda _opt: capture(trainer))
        trainer.step(x[idx].to(dev), y[idx].to(dev))
    with torch.no_grad():
        for p, b in zip(model.parameters(), before):
            p.copy_(b)
    return grads
