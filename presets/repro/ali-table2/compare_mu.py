"""ALI-DPFL's mu estimators side by side on one trajectory (the diagnosis behind server/ali_mu.py's dp-secant).

    PRIVFED_DATA_DIR=../shared/data python presets/repro/ali-table2/compare_mu.py \
        [--suite ali-table7] [--column "Dir(0.5)"] [--seed 1] [--rounds 6] [--out /tmp/privfed-compare-mu]

Runs the suite's ALI-DPFL cell with the paper's estimator (true full-batch client gradients: it drives tau,
and it leaks, so only for this diagnosis) and stops after `--rounds` rounds. Each round the same aggregate
also feeds:
- `dp-secant`: privfed's estimator (server/ali_mu.py), the release noise V_k + V_{k-1} subtracted;
- `dp-secant-cross`: the same, also solving for the cross term an isotropic quadratic predicts,
  mu^2 D^2 + mu eta (V_k + V_{k-1}) = debiased signal (a reviewer's proposal, session 19).
Prints each round's three values, their medians and a JSON line. Session 19 (seed 1, 6 rounds): paper
median 0.38 (IID) and 1.20 (Dir(0.5)); dp-secant 0.16 and 0.13; dp-secant-cross 0.03 and 0.03.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

from common.config import validate  # noqa: E402
from common.records import arrays_to_vector  # noqa: E402
from server.ali_mu import SecantMu  # noqa: E402
from server.inprocess import run_inprocess  # noqa: E402
from server.report import expected_config, load_suite  # noqa: E402
from server.strategies import ali_dpfl  # noqa: E402


class Enough(Exception):
    """The rounds asked for are measured."""


def with_cross_term(est: SecantMu, w_start: np.ndarray, w_end: np.ndarray, previous) -> float | None:
    """The positive root of D^2 mu^2 + eta (V_k + V_{k-1}) mu - signal (after est.update of this round)."""
    if previous is None or est.last_signal is None or est.last_signal <= 0:
        return None
    d2 = float(np.sum((0.5 * (w_start + w_end) - previous[1]) ** 2))
    b = est.lr * (est._prev[2] + previous[2])
    return 2.0 * est.last_signal / (b + math.sqrt(b * b + 4.0 * d2 * est.last_signal)) if d2 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="ali-table7")
    ap.add_argument("--column", default="Dir(0.5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="/tmp/privfed-compare-mu")
    args = ap.parse_args()
    cell = next(c for c in load_suite(args.suite).cells if c.row == "ALI-DPFL" and c.column == args.column)
    config = validate({**expected_config(cell, args.seed), "ali-mu-estimator": "paper", "results-dir": args.out,
                       "state-dir": f"{args.out}/state", "run-name": ""})
    rows: list[dict] = []
    paper_mu = ali_dpfl.AliDpfl._estimate_mu

    def side_by_side(self, arrays, good, grad_diffs):
        paper = paper_mu(self, arrays, good, grad_diffs)
        est = self.__dict__.setdefault("_compare", SecantMu(self.lr, self.q, self.clip, self.sigma,
                                                            self.roster.num_examples))
        parts = [self._partition_of[m.metadata.src_node_id] for m in good]
        total = sum(self.roster.num_examples[p] for p in parts)
        previous, w_end = est._prev, arrays_to_vector(arrays)
        secant = est.update(self._w_start, w_end, self._tau, {p: self.roster.num_examples[p] / total for p in parts})
        rows.append({"tau": self._tau, "paper": paper, "dp-secant": secant,
                     "dp-secant-cross": with_cross_term(est, self._w_start, w_end, previous)})
        print("  round {:>3}  tau {:>2}  ".format(len(rows), self._tau)
              + "  ".join(f"{k} {v:.4f}" if v is not None else f"{k} -" for k, v in list(rows[-1].items())[1:]))
        if len(rows) >= args.rounds:
            raise Enough
        return paper

    ali_dpfl.AliDpfl._estimate_mu = side_by_side
    try:
        run_inprocess(config, threads=1)
    except Enough:
        pass
    medians = {k: statistics.median(v) if (v := [r[k] for r in rows if r[k] is not None]) else None
               for k in ("paper", "dp-secant", "dp-secant-cross")}
    print("medians: " + ", ".join(f"{k} {v:.4f}" for k, v in medians.items() if v is not None))
    print(json.dumps({"suite": args.suite, "column": args.column, "seed": args.seed, "rounds": len(rows),
                      **{f"median_{k}": v for k, v in medians.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
