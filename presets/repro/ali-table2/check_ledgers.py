"""Check the privacy ledgers of a finished ALI suite from the clients' own files.

    PYTHONPATH=. python presets/repro/ali-table2/check_ledgers.py results/repro/ali-table2

For every planned cell and seed of the suite snapshot (<out>/<suite>/suite.json), the
run must be finished (s<seed>/summary.json with the cell's config, `run_is_finished`):
a missing or stale one is reported as MISSING. For every cell with a finished run: each
finished run's own ledgers (node-state/<the folder its summary.json names>, one per client:
num-clients of them; a run that names none, or lacks some, is reported) must have epsilon
<= the cell's target-epsilon (by its accountant); for ALI-DPFL cells with R_s < R_c, every
ledger must end within 1% of the target. Prints one line per cell and exits 1 on any
violation or missing run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.privacy import ali
from common.privacy.ledger import PrivacyLedger
from server.report import expected_config, read_snapshot, run_is_finished


def run_ledgers(folder: Path, seed: int, clients: int) -> tuple[list[Path], str]:
    """A finished run's own client ledgers, and what is wrong with them ("" when nothing): node-state/
    holds every run's, in folders named by a run id only summary.json records (server/runner.py)."""
    name = json.loads((folder / f"s{seed}" / "summary.json").read_text()).get("node_state")
    if not name:
        return [], f"s{seed}: summary.json names no node-state folder: its ledgers are unknown"
    files = sorted((folder / "node-state" / name).glob("*.ledger.json"))
    return files, "" if len(files) == clients else f"s{seed}: {len(files)} of {clients} ledgers in node-state/{name}"


def main(root: str) -> int:
    bad = 0
    for cell in read_snapshot(Path(root)).cells:
        folder = Path(root) / cell.folder
        done = [s for s in cell.seeds if run_is_finished(folder / f"s{s}", cell, s)]
        if len(done) < len(cell.seeds):
            bad += 1
            print(f"MISSING {cell.folder} ({cell.label}): no finished run for seed(s) "
                  + ", ".join(str(s) for s in cell.seeds if s not in done))
        if not done:
            continue
        config = expected_config(cell, done[0])
        target, delta, acc = float(config["target-epsilon"]), float(config["target-delta"]), config["accountant"]
        rc = ali.iteration_budget(target, delta, float(config["dp-sample-rate"]),
                                  float(config["dp-noise-multiplier"]), acc)
        must_spend = config["strategy"] == "ali-dpfl" and int(config["num-rounds"]) < rc
        found = [run_ledgers(folder, s, int(config["num-clients"])) for s in done]
        problems = [problem for _, problem in found if problem]
        eps = [PrivacyLedger.load(f).epsilon(delta, accountant=acc) for files, _ in found for f in files]
        over = [e for e in eps if e > target]
        under = [e for e in eps if must_spend and e < 0.99 * target]
        ok = eps and not over and not under and not problems
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {cell.folder}: {len(done)} run(s), {len(eps)} ledgers, epsilon "
              f"{min(eps, default=float('nan')):.4f}..{max(eps, default=float('nan')):.4f} / target {target} "
              f"({acc}); R_c = {rc}{', must end within 1%' if must_spend else ''}")
        for problem in problems:
            print(f"    {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="the suite's results folder, e.g. results/repro/ali-table2")
    root = ap.parse_args().results
    if not (Path(root) / "suite.json").is_file():
        sys.exit(f"check_ledgers: no {Path(root) / 'suite.json'}: not the results folder of a `privfed repro` suite")
    sys.exit(main(root))
