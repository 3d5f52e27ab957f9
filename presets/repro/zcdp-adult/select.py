"""Pick the zcdp-adult hyperparameters from the tuning suite's results (validation accuracy).

    python presets/repro/zcdp-adult/select.py [results/repro/zcdp-adult-tuning]

Prints, per family (row of tuning/suite.toml), every setting's final validation accuracy and the
winner: the highest accuracy; ties (within 0.05 points) go to the smaller lr, then the smaller batch.
Copy the winners into TUNED in make_suites.py and regenerate the suites.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path


def parse(column: str) -> tuple[int, float, float]:
    m = re.fullmatch(r"gamma=(\d+) G=([\d.]+) eta=([\d.]+)", column)
    if not m:
        raise ValueError(f"unexpected column {column!r}")
    return int(m[1]), float(m[2]), float(m[3])


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "results/repro/zcdp-adult-tuning")
    rows: dict[str, list[tuple[float, tuple[int, float, float]]]] = {}
    with (folder / "report.csv").open() as fh:
        for rec in csv.DictReader(fh):
            if rec["ours_mean"]:
                rows.setdefault(rec["row"], []).append((float(rec["ours_mean"]), parse(rec["column"])))
    for family, results in rows.items():
        best = max(a for a, _ in results)
        tied = [hp for a, hp in results if a >= best - 0.05]
        winner = min(tied, key=lambda hp: (hp[2], hp[0]))
        print(f"{family}:")
        for acc, (g, c, e) in sorted(results, key=lambda x: -x[0]):
            mark = "  <- winner" if (g, c, e) == winner else ""
            print(f"    gamma={g:<5} G={c:<4g} eta={e:<6g} validation accuracy {acc:.2f}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
