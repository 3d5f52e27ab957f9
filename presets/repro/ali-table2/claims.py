"""Check the ALI-DPFL claims of `ali-table2` / `ali-table7` on a suite's finished runs.

    python presets/repro/ali-table2/claims.py [--suite ali-table2] [--out results/repro]

For every column: R_s and R_c (from the column's ALI-DPFL config, by the accountant the clients enforce),
ALI-DPFL's mean final accuracy over seeds, the best fixed-tau row, their difference, and ALI-DPFL minus
the paper. The issue's claims: ALI-DPFL >= the best fixed tau (in ali-table2 where R_s < R_c, in
ali-table7 in every column) and, in ali-table2, within 1.5 points of the paper in every cell. The privacy
claims (no run past its target, R_s < R_c runs within 1 % of it) are `check_ledgers.py`'s. Ends with one
JSON line of the counts, over the planned columns: a column whose ALI-DPFL cell or any fixed-tau row lacks
runs or seeds (fewer finished than the cell's seeds) is incomplete (counted in `incomplete`), never a pass.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from common.config import validate  # noqa: E402
from common.privacy.ali import iteration_budget  # noqa: E402
from server.report import load_suite, mean_difference, results_by_cell  # noqa: E402

ALI_ROW = "ALI-DPFL"
PAPER_TOLERANCE = 1.5  # points, ali-table2 only


def rounds_and_budget(cell) -> tuple[int, int]:
    """(R_s, R_c) of an ALI-DPFL cell."""
    config = validate(cell.overrides)
    return int(config["num-rounds"]), iteration_budget(
        float(config["target-epsilon"]), float(config["target-delta"]), float(config["dp-sample-rate"]),
        float(config["dp-noise-multiplier"]), str(config["accountant"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="ali-table2", help="ali-table2 or ali-table7")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "repro", help="privfed repro --out")
    args = parser.parse_args()
    suite = load_suite(args.suite)
    results = results_by_cell(suite, args.out)
    against_paper = suite.name == "ali-table2"

    best_holds = best_checked = near_paper = paper_checked = incomplete = 0
    print(f"{suite.name}: final test accuracy (%), mean over seeds")
    for column in suite.columns:
        ali = results.get((ALI_ROW, column))
        fixed = [r for (row, c), r in results.items() if c == column and row != ALI_ROW]
        rs, rc = rounds_and_budget(ali.cell) if ali is not None else (None, None)
        claimed = not against_paper or (rs is not None and rs < rc)
        best_checked += claimed
        paper_checked += against_paper and ali is not None and ali.cell.paper is not None
        short = [r for r in ([ali] if ali else []) + fixed if r.n < len(r.cell.seeds)]
        if ali is None or not fixed or short:
            incomplete += 1
            print(f"  {column:<24} INCOMPLETE: " + (", ".join(f"{r.cell.row} {r.n}/{len(r.cell.seeds)} seeds"
                                                             for r in short) or "no ALI-DPFL or fixed-tau cell"))
            continue
        best = max(fixed, key=lambda r: r.mean)
        diff = mean_difference(ali.mean, best.mean)
        line = (f"  {column:<24} R_s {rs:>3} R_c {rc:>3}  ALI-DPFL {ali.mean:6.2f}  best fixed {best.cell.row:<6} "
                f"{best.mean:6.2f}  {diff:+6.2f}")
        if claimed:
            best_holds += diff >= 0
            line += "  holds" if diff >= 0 else "  MISS"
        else:
            line += "  (R_s >= R_c: not claimed)"
        if against_paper and ali.diff is not None:
            near_paper += abs(ali.diff) <= PAPER_TOLERANCE
            line += f"  | paper {ali.cell.paper:6.2f}  {ali.diff:+6.2f}"
        print(line)
    print(f"ALI-DPFL >= best fixed tau: {best_holds} of {best_checked} columns"
          + (f" ({incomplete} of {len(suite.columns)} columns incomplete)" if incomplete else ""))
    summary = {"suite": suite.name, "ali_ge_best_fixed_tau": f"{best_holds}/{best_checked}"}
    if against_paper:
        print(f"ALI-DPFL within {PAPER_TOLERANCE:g} points of the paper: {near_paper} of {paper_checked} columns")
        summary[f"ali_within_{PAPER_TOLERANCE:g}_points_of_paper"] = f"{near_paper}/{paper_checked}"
    summary["incomplete"] = incomplete
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
