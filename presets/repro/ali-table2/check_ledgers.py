"""Check the privacy ledgers of a finished ALI suite from the clients' own files.

    PYTHONPATH=. python presets/repro/ali-table2/check_ledgers.py results/repro/ali-table2

For every cell folder (<out>/<suite>/<row>__<column>/) with a finished run
(s*/summary.json): every client ledger under node-state/ must have epsilon <=
the run's target-epsilon (by the run's accountant); for ALI-DPFL runs with
R_s < R_c, every ledger must end within 1% of the target. Prints one line per
cell and exits 1 on any violation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common.privacy import ali
from common.privacy.ledger import PrivacyLedger


def main(root: str) -> int:
    bad = 0
    for cell in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        summaries = sorted(cell.glob("s*/summary.json"))
        if not summaries:
            continue
        config = json.loads(summaries[0].read_text())["config"]
        target, delta, acc = float(config["target-epsilon"]), float(config["target-delta"]), config["accountant"]
        rc = ali.iteration_budget(target, delta, float(config["dp-sample-rate"]),
                                  float(config["dp-noise-multiplier"]), acc)
        must_spend = config["strategy"] == "ali-dpfl" and int(config["num-rounds"]) < rc
        eps = [PrivacyLedger.load(f).epsilon(delta, accountant=acc) for f in cell.glob("node-state/*/*.ledger.json")]
        over = [e for e in eps if e > target]
        under = [e for e in eps if must_spend and e < 0.99 * target]
        ok = eps and not over and not under
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {cell.name}: {len(summaries)} run(s), {len(eps)} ledgers, epsilon "
              f"{min(eps, default=float('nan')):.4f}..{max(eps, default=float('nan')):.4f} / target {target} "
              f"({acc}); R_c = {rc}{', must end within 1%' if must_spend else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
