"""Benchmark: finding R_c, the largest number of DP-SGD steps within a privacy budget, ours vs the
previous search, under the PLD accountant (ALI-DPFL's `accountant = "pld"`, where each probe composes a
privacy-loss distribution afresh).

Ours (`accounting.max_steps`): secant probes on the sqrt(steps) scale, Brent-safeguarded, first probing
the RDP answer (a cheap lower bound), each probe self-composing a one-step PLD built once. Reference:
the previous exact search, kept here verbatim (doubling from 1, then bisection), each probe a fresh
`PLDAccountant` (`dpsgd_epsilon`). Both return the exact boundary eps(R_c) <= target < eps(R_c + 1),
asserted equal. Each is timed from cold caches, at ALI-DPFL's q = 0.015, sigma = 1.1, delta = 1e-5
and the Table II epsilons.

    python benchmarks/iteration_budget.py [--epsilons 1.55,2,2.75,4]

Prints both side by side, the ratios, and a final JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import positive_list  # noqa: E402  (this folder: the benchmarks' own)

from common.privacy import accounting  # noqa: E402

Q, SIGMA, DELTA = 0.015, 1.1, 1e-5


def doubling_then_bisection(eps, target: float) -> int:
    """The previous search (2 log2(R_c) probes)."""
    if eps(1) > target:
        return 0
    lo, hi = 1, 2
    while eps(hi) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if eps(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def timed(search) -> tuple[int, float]:
    """(R_c, seconds) from cold accountant caches."""
    accounting.clear_caches()
    t0 = time.perf_counter()
    rc = search()
    return rc, time.perf_counter() - t0


@contextlib.contextmanager
def counting_ours(probes: list[int]):
    """Count the probes of max_steps' own epsilon function."""
    real = accounting._pld_steps_epsilon

    def counted(*args):
        eps = real(*args)
        return lambda steps: probes.append(steps) or eps(steps)

    accounting._pld_steps_epsilon = counted
    try:
        yield
    finally:
        accounting._pld_steps_epsilon = real


def reference_eps(probes: list[int]):
    def eps(steps: int) -> float:
        probes.append(steps)
        return accounting.dpsgd_epsilon(Q, SIGMA, steps, DELTA, accountant="pld")
    return eps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", type=positive_list(float), default="1.55,2,2.75,4")
    args = parser.parse_args(argv)
    targets = args.epsilons

    accounting.dpsgd_epsilon(Q, SIGMA, 1, DELTA, accountant="pld")  # warm-up: first-use imports
    rows = []
    print(f"{'epsilon':>8} {'R_c':>6} | {'ours s':>7} {'probes':>6} | {'reference s':>11} {'probes':>6} | ratio")
    for target in targets:
        ours_probes: list[int] = []
        with counting_ours(ours_probes):
            rc, t_ours = timed(lambda: accounting.max_steps(target, DELTA, Q, SIGMA, accountant="pld"))
        ref_probes: list[int] = []
        rc_ref, t_ref = timed(lambda: doubling_then_bisection(reference_eps(ref_probes), target))
        n_ours, n_ref = len(set(ours_probes)), len(set(ref_probes))
        if rc != rc_ref:
            raise SystemExit(f"R_c differs at epsilon {target}: ours {rc}, reference {rc_ref}")
        rows.append((target, rc, t_ours, n_ours, t_ref, n_ref))
        print(f"{target:>8g} {rc:>6d} | {t_ours:>7.2f} {n_ours:>6d} | {t_ref:>11.2f} {n_ref:>6d} | {t_ref / t_ours:5.1f}x")
    ours_s = sum(r[2] for r in rows)
    ref_s = sum(r[4] for r in rows)
    print(f"total: ours {ours_s:.2f} s, reference {ref_s:.2f} s, ratio {ref_s / ours_s:.1f}x (same R_c everywhere)")
    print(json.dumps({"benchmark": "iteration_budget", "accountant": "pld", "epsilons": targets,
                      "r_c": [r[1] for r in rows], "ours_s": round(ours_s, 3), "reference_s": round(ref_s, 3),
                      "ours_probes": [r[3] for r in rows], "reference_probes": [r[5] for r in rows],
                      "ratio": round(ref_s / ours_s, 2)}))


if __name__ == "__main__":
    main()
