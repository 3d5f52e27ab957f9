"""Benchmark: local training of logistic regression with its kernels called by
hand (client/updates/batch_gradient.py) against autograd, side by side.

The workload is one Table-1 client round: `logreg-softmax` (60 features, 10
classes: the Synthetic federations' shape), batch 32, SGD momentum 0.5, on
640 random examples (no data files needed; the cost does not depend on the
values). Two loops, each run with both gradient paths, alternating:

- `train_sgd` (FedAvg, FedAvgM, FedYogi clients);
- `train_corrected` with a proximal term (FedProx; SCAFFOLD and FedDyn run
  the same loop).

Both paths end with bit-identical weights (asserted here as well as in
tests/test_batch_gradient.py). Prints microseconds per step, the ratio, and a
final JSON line. Torch runs with 1 thread, as the in-process engine does.

    python benchmarks/local_step.py [--epochs 10] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import positive_int  # noqa: E402  (this folder: the benchmarks' own)

import torch  # noqa: E402

import client.updates.batch_gradient as bg  # noqa: E402
from client.updates.corrected import train_corrected  # noqa: E402
from client.updates.sgd import train_sgd  # noqa: E402
from common.models import build_model  # noqa: E402

FEATURES, CLASSES, EXAMPLES, BATCH = 60, 10, 640, 32


def one_round(loop: str, epochs: int) -> tuple[float, int, dict]:
    """(seconds, steps, final weights) of one client round of `loop`."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(EXAMPLES, FEATURES, generator=g), torch.randint(0, CLASSES, (EXAMPLES,), generator=g)
    torch.manual_seed(0)
    model = build_model("logreg-softmax", (FEATURES,), CLASSES)
    kw = dict(epochs=epochs, batch_size=BATCH, lr=0.1, momentum=0.5, generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    if loop == "sgd":
        train_sgd(model, x, y, **kw)
    else:
        anchor = {k: v.detach().clone() for k, v in model.named_parameters()}

        def proximal(params, grads):
            for name, grad in grads.items():
                grad.add_(params[name] - anchor[name], alpha=0.01)
        train_corrected(model, x, y, correction=proximal, **kw)
    seconds = time.perf_counter() - start
    return seconds, epochs * -(-EXAMPLES // BATCH), model.state_dict()


def measure(loop: str, epochs: int, repeat: int) -> dict:
    ours, autograd = [], []
    for _ in range(repeat):  # alternate, so drift in the machine's speed hits both alike
        seconds, steps, weights = one_round(loop, epochs)
        ours.append(seconds / steps)
        with mock.patch.object(bg, "_logistic_regression", lambda model: (None, False)):
            seconds, _, reference = one_round(loop, epochs)
        autograd.append(seconds / steps)
        assert all(torch.equal(weights[k], reference[k]) for k in weights), "the two paths differ"
    ours_us, reference_us = statistics.median(ours) * 1e6, statistics.median(autograd) * 1e6
    return {"loop": loop, "steps": steps, "ours_us": round(ours_us, 1), "reference_us": round(reference_us, 1),
            "ratio": round(reference_us / ours_us, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=positive_int, default=10)
    parser.add_argument("--repeat", type=positive_int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"logreg-softmax {FEATURES}x{CLASSES}, batch {BATCH}, {EXAMPLES} examples x {args.epochs} epochs, "
          f"median of {args.repeat} rounds per path, 1 thread; bit-identical weights asserted")
    print(f"{'loop':<10} {'by hand us/step':>16} {'autograd us/step':>17} {'ratio':>6}")
    rows = [measure(loop, args.epochs, args.repeat) for loop in ("sgd", "corrected")]
    for row in rows:
        print(f"{row['loop']:<10} {row['ours_us']:16.1f} {row['reference_us']:17.1f} {row['ratio']:6.2f}")
    print(json.dumps({"benchmark": "local_step", "ours_us": rows[0]["ours_us"],
                      "reference_us": rows[0]["reference_us"], "ratio": rows[0]["ratio"], "loops": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
