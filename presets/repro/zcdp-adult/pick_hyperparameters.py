"""Pick the zcdp-adult hyperparameters from the tuning suite's runs (final validation accuracy).

    python presets/repro/zcdp-adult/pick_hyperparameters.py [results/repro/zcdp-adult-tuning]

Reads every finished run of tuning/suite.toml directly (its metrics.jsonl; a run counts when the
overrides of its cell match the config in its summary.json, so runs made before other keys were added
to the schema still count). Prints, per family, every setting's final validation accuracy and the
winner: the highest accuracy; ties (within 0.05 points) go to the smaller lr, then the smaller batch.
Settings of a family without a finished run are listed, and its winner marked as of an incomplete grid.
Copy the winners into TUNED in make_suites.py and regenerate the suites.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))


def accuracy(run: Path, cell) -> float | None:
    """Final validation accuracy (%) of the run, None when it has not finished with the cell's config."""
    if not (run / "summary.json").is_file():
        return None
    config = json.loads((run / "summary.json").read_text())["config"]
    if any(config.get(k) != v for k, v in cell.overrides.items() if k not in ("data-dir",)):
        return None
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["accuracy"] * 100


def setting(hp: tuple[int, float, float]) -> str:
    return f"gamma={hp[0]:<5} G={hp[1]:<4g} eta={hp[2]:<6g}"


def main() -> int:
    from server.report import load_suite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=REPO / "results/repro/zcdp-adult-tuning",
                    help="the tuning suite's results folder")
    folder = Path(ap.parse_args().folder)
    suite = load_suite(str(Path(__file__).resolve().parent / "tuning"))
    families: dict[str, list[tuple[float | None, tuple[int, float, float]]]] = {}
    for cell in suite.cells:
        m = re.fullmatch(r"gamma=(\d+) G=([\d.]+) eta=([\d.]+)", cell.column)
        families.setdefault(cell.row, []).append((accuracy(folder / cell.folder / "s100", cell),
                                                  (int(m[1]), float(m[2]), float(m[3]))))
    for family, results in families.items():
        done = [(a, hp) for a, hp in results if a is not None]
        missing = [hp for a, hp in results if a is None]
        if not done:
            print(f"{family}: no finished run of its {len(results)} settings")
            continue
        best = max(a for a, _ in done)
        winner = min((hp for a, hp in done if a >= best - 0.05), key=lambda hp: (hp[2], hp[0]))
        # a setting without a run may be the best one: the winner is only of the settings that ran
        print(f"{family}:" + (f" INCOMPLETE grid, {len(missing)} of {len(results)} settings without a finished run"
                              if missing else ""))
        for acc, hp in sorted(done, key=lambda x: -x[0]):
            mark = ("  <- winner" + (" (of an incomplete grid)" if missing else "")) if hp == winner else ""
            print(f"    {setting(hp)} validation accuracy {acc:.2f}{mark}")
        for hp in missing:
            print(f"    {setting(hp)} no finished run (missing, crashed or stale)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
