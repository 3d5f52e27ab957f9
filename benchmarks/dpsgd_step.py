"""Benchmark: the cost of DP-SGD, and of accounting.

1. Time per DP-SGD step (Opacus per-sample gradients, clipping, noise; batch 64)
   against a plain SGD step on the same batch, for the ALI-DPFL MNIST CNN and the
   FedLAP-DP ConvNet (CIFAR shape), on CPU, for each Opacus grad-sample mode.
   Prints ms/step and the ratio DP / non-private measured in the same run.
2. Time to compute epsilon(1e-5) of a 3000-step ledger (15 rounds x 200 steps,
   q = 256/10000, sigma = 1: FedLAP-DP's setting) with each accountant, and the
   ratio to the RDP accountant. The accountants' caches are cleared before
   every timed call, so each time is a full computation.

Ends with one JSON line of every figure.

    python benchmarks/dpsgd_step.py [--steps 5] [--warmup 2] [--threads N] [--models ali-mnist-cnn convnet]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import at_least, positive_int  # noqa: E402  (this folder: the benchmarks' own)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from common.models import build_model  # noqa: E402
from common.privacy import accounting  # noqa: E402
from common.privacy.dpsgd import GRAD_SAMPLE_MODES, DpSgd  # noqa: E402
from common.privacy.events import dpsgd_steps  # noqa: E402
from common.privacy.ledger import PrivacyLedger  # noqa: E402

SHAPES = {"ali-mnist-cnn": (1, 28, 28), "convnet": (3, 32, 32)}
BATCH = 64


def _time(fn, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_steps(models: list[str], steps: int, warmup: int) -> list[dict]:
    print(f"DP-SGD step vs non-private SGD step: batch {BATCH}, CPU, {torch.get_num_threads()} threads, "
          f"median of {steps} steps after {warmup} warm-up")
    print(f"{'model':<15} {'mode':<12} {'ms/step':>9} {'ratio':>7}")
    rows = []
    for name in models:
        shape = SHAPES[name]
        g = torch.Generator().manual_seed(0)
        x = torch.randn(BATCH, *shape, generator=g)
        y = torch.randint(0, 10, (BATCH,), generator=g)

        torch.manual_seed(0)
        model = build_model(name, shape, 10)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def plain_step():
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        base = _time(plain_step, steps, warmup)
        print(f"{name:<15} {'non-private':<12} {base * 1e3:9.1f} {1.0:7.2f}")
        rows.append({"model": name, "mode": "non-private", "ms": round(base * 1e3, 3), "ratio": 1.0})
        for mode in GRAD_SAMPLE_MODES:
            torch.manual_seed(0)
            dp_model = build_model(name, shape, 10)
            # |D| = 6400, q = 0.01: the step divides by the expected batch size 64
            with DpSgd(dp_model, dataset_size=6400, sample_rate=0.01, max_grad_norm=1.0, noise_multiplier=1.0,
                       lr=0.01, grad_sample_mode=mode,
                       noise_generator=torch.Generator().manual_seed(1)) as trainer:
                try:
                    t = _time(lambda: trainer.step(x, y), steps, warmup)
                except Exception as err:  # a mode a layer does not support
                    print(f"{name:<15} {mode:<12} {'failed':>9}  ({type(err).__name__}: {err})")
                    rows.append({"model": name, "mode": mode, "ms": None, "ratio": None})
                    continue
            print(f"{name:<15} {mode:<12} {t * 1e3:9.1f} {t / base:7.2f}")
            rows.append({"model": name, "mode": mode, "ms": round(t * 1e3, 3), "ratio": round(t / base, 3)})
    return rows


def bench_accounting(repeats: int = 3) -> list[dict]:
    q, sigma, delta = 256 / 10000, 1.0, 1e-5
    ledger = PrivacyLedger([dpsgd_steps(q, sigma, 200, round=r) for r in range(1, 16)])
    print(f"\nepsilon({delta:g}) of a 3000-step ledger (15 entries x 200 steps, q = {q:g}, sigma = {sigma:g}), "
          f"median of {repeats}")
    print(f"{'accountant':<22} {'epsilon':>9} {'ms':>9} {'vs rdp':>7}")
    runs = [("rdp", "balle"), ("rdp", "classic"), ("pld", None), ("fedlap-thm5.8", None), ("ali-eq12", None)]
    ref = None
    rows = []
    for name, conversion in runs:
        kwargs = {"conversion": conversion} if conversion else {}
        times, eps = [], None
        for _ in range(repeats):
            accounting.clear_caches()  # a repeat would time a cache hit
            t0 = time.perf_counter()
            eps = ledger.epsilon(delta, name, **kwargs)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        ref = ref or t
        label = f"{name}/{conversion}" if conversion else name
        print(f"{label:<22} {eps:9.4f} {t * 1e3:9.1f} {t / ref:7.2f}")
        rows.append({"accountant": label, "epsilon": round(eps, 4), "ms": round(t * 1e3, 3),
                     "ratio_vs_rdp": round(t / ref, 3)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps per configuration (median reported)")
    p.add_argument("--warmup", type=at_least(0), default=2)
    p.add_argument("--threads", type=at_least(0), default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--skip-steps", action="store_true", help="only the accounting benchmark")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    steps = [] if args.skip_steps else bench_steps(args.models, args.steps, args.warmup)
    print(json.dumps({"benchmark": "dpsgd_step", "batch": BATCH, "threads": torch.get_num_threads(),
                      "steps": steps, "accounting": bench_accounting()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
