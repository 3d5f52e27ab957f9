"""Epsilon of every run of the upcycled-privacy suite, beside its final loss and accuracy.

    python presets/repro/upcycled-privacy/epsilons.py [SUITE_RESULTS_DIR] [--delta 1e-5]

SUITE_RESULTS_DIR defaults to results/repro/upcycled-privacy. For each finished run (one of the cell's
seeds with the cell's config, `run_is_finished`, as report.md counts it: a stale run is left out) it rebuilds every
client's ledger from the run's own rows (a client is charged in every round in which it received a train
instruction: all clients in every round with clients > 0, since these runs sample every client) with
`common.privacy.plan.planned_entries`, the function the clients and the server's mirror use, and the
client's real |D_i|. It checks the rebuilt epsilon against the mirror's (summary.json) and reports, at
delta (default 1e-5): RDP and PLD (dp-accounting), the paper's form (output: Thm 6.2 closed form
`upcycled-thm6.2`; objective: Thm 6.3, the pure-DP sum), and for output perturbation also RDP with the
honest 'ball' sensitivity 2 tau. Epsilons are mean (the paper's eps-bar) and max over the 30 clients.
Writes SUITE_RESULTS_DIR/epsilons.md and epsilons.csv and prints the table: every cell of the suite
snapshot, a cell without finished runs as 0 seeds and dashes. Then the issue's claim, per mechanism and
column: Upcycled has both the lower epsilon (RDP mean over the clients; objective: the pure-DP sum) and the
better mean final accuracy; a cell with fewer finite accuracies than planned seeds makes its column
incomplete, never a pass. Ends with one JSON line of the count.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from common.config import SCHEMA, drop_unread, validate  # noqa: E402
from common.data import load_client  # noqa: E402
from common.data.errors import DataFileError  # noqa: E402
from common.privacy.ledger import PrivacyLedger  # noqa: E402
from common.privacy.plan import planned_entries  # noqa: E402
from server.report import _measured, read_rows, read_snapshot, run_is_finished  # noqa: E402


def ledgers_for(config, rows) -> dict[int, PrivacyLedger]:
    sizes = {p: load_client(config, p).num_train for p in range(int(config["num-clients"]))}
    rounds = [r["round"] for r in rows if r.get("clients")]
    train_round = {r: i + 1 for i, r in enumerate(rounds)}
    out = {}
    for p, n in sizes.items():
        ledger = PrivacyLedger(owner=f"partition-{p}")
        for r in rounds:
            ledger.record(*planned_entries(config, {"server-round": r, "train-round": train_round[r]},
                                           dataset_size=n))
        out[p] = ledger
    return out


def run_epsilons(run_dir: Path, delta: float) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    # the schema may have grown; a run from before the mode table (common/config.py _MODES) may hold unread keys
    config = validate(drop_unread({k: v for k, v in summary["config"].items() if k in SCHEMA}))
    rows = read_rows(run_dir)
    ledgers = ledgers_for(config, rows)
    mech = str(config["privacy"])
    paper = "upcycled-thm6.2" if mech == "output" else "rdp"  # objective: only pure entries, rdp = the pure sum
    res: dict[str, float] = {}
    for name, acc in (("rdp", "rdp"), ("pld", "pld"), ("paper", paper)):
        eps = [led.epsilon(delta, accountant=acc) for led in ledgers.values()]
        res[f"{name}_mean"], res[f"{name}_max"] = sum(eps) / len(eps), max(eps)
    if mech == "output":
        ball = validate({**dict(config), "output-sensitivity": "ball"})
        eps = [led.epsilon(delta) for led in ledgers_for(ball, rows).values()]
        res["ball_rdp_max"] = max(eps)
    mirror = [v["epsilon"]["rdp"] for v in summary["privacy"]["ledgers"].values()]
    stated = 0.0 if mech == "objective" else delta  # pure entries: the mirror states delta 0
    if not math.isclose(max(mirror), res["rdp_max"], rel_tol=1e-6) or summary["privacy"]["delta"] != stated:
        res["mirror_note"] = f"mirror rdp max {max(mirror):.6g} at delta {summary['privacy']['delta']}"
    res["leaking_rounds"] = sum(1 for r in rows if r.get("clients"))
    # a diverged model's accuracy and loss are null (NaN): the table leaves them out of its means, and says so
    res["accuracy"], res["loss"] = _measured(rows[-1], "accuracy"), _measured(rows[-1], "loss")
    if diverged := summary.get("diverged"):
        res["diverged_note"] = (f"the global model diverged in round {diverged['round']}; left out of the "
                                "accuracy and loss means")
    return res


def _mean(values: list[float]) -> float | None:
    """Over the finite values (a diverged seed's NaN accuracy is left out); None if there is none."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def suite_epsilons(suite_dir: Path, delta: float) -> dict[tuple[str, str], list[dict]]:
    """(row, column) -> run_epsilons of each finished seed, for every cell of the snapshot (maybe [])."""
    return {(cell.row, cell.column): [{**run_epsilons(suite_dir / cell.folder / f"s{seed}", delta), "seed": seed}
                                      for seed in cell.seeds
                                      if run_is_finished(suite_dir / cell.folder / f"s{seed}", cell, seed)]
            for cell in read_snapshot(suite_dir).cells}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite_dir", nargs="?", default=str(ROOT / "results/repro/upcycled-privacy"))
    ap.add_argument("--delta", type=float, default=1e-5)
    args = ap.parse_args(argv)
    suite_dir = Path(args.suite_dir)
    if not (suite_dir / "suite.json").is_file():
        print(f"epsilons.py: no suite results in {suite_dir} (run `privfed repro upcycled-privacy` first)",
              file=sys.stderr)
        return 2
    try:
        cells = suite_epsilons(suite_dir, args.delta)
    except DataFileError as exc:  # the ledgers need every client's |D_i|, so the data files
        print(f"epsilons.py: {exc}", file=sys.stderr)
        return 2
    keys = ["accuracy", "loss", "rdp_mean", "rdp_max", "pld_mean", "pld_max", "paper_mean", "paper_max",
            "ball_rdp_max", "leaking_rounds"]
    lines = [f"# upcycled-privacy: epsilon beside final accuracy and loss (delta = {args.delta:g})", "",
             "Mean over seeds. eps mean/max: over the 30 clients (mean = the paper's eps-bar). paper: Thm 6.2 "
             "closed form (output) / Thm 6.3 pure-DP sum (objective, the runs' u1 and u2, by default 2 and 1; "
             "the theorem's ||x|| <= 1 does not hold on the unnormalised Syn data). ball: RDP with sensitivity 2 tau "
             "(honest, any two datasets); the other output columns use the paper's tau/|D_i|.", "",
             "| row | column | seeds | acc % | loss | leaking rounds | RDP mean | RDP max | PLD mean | PLD max | "
             "paper mean | paper max | ball RDP max |", "|" + "---|" * 13]
    table = []
    for (row, column), runs in cells.items():
        mean = {k: _mean([r[k] for r in runs]) if runs and all(k in r for r in runs) else None for k in keys}
        table.append({"row": row, "column": column, "seeds": len(runs), **mean})
        f = lambda v, d=3: "—" if v is None else f"{v:.{d}f}"  # noqa: E731
        acc = None if mean["accuracy"] is None else mean["accuracy"] * 100
        lines.append(f"| {row} | {column} | {len(runs) or '—'} | {f(acc, 2)} | {f(mean['loss'])} | "
                     f"{f(mean['leaking_rounds'], 0)} | {f(mean['rdp_mean'])} | {f(mean['rdp_max'])} | "
                     f"{f(mean['pld_mean'])} | {f(mean['pld_max'])} | {f(mean['paper_mean'])} | "
                     f"{f(mean['paper_max'])} | {f(mean['ball_rdp_max'], 1)} |")
        notes = {r["mirror_note"] for r in runs if "mirror_note" in r}
        notes |= {f"seed {r['seed']}: {r['diverged_note']}" for r in runs if "diverged_note" in r}
        for note in notes:
            lines.append(f"|  | note | {note} |" + " |" * 10)
    lines += ["", *claim_lines(cells, {(c.row, c.column): len(c.seeds) for c in read_snapshot(suite_dir).cells})]
    (suite_dir / "epsilons.md").write_text("\n".join(lines) + "\n")
    with (suite_dir / "epsilons.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["row", "column", "seeds", *keys])
        w.writeheader()
        w.writerows(table)
    print("\n".join(lines))
    return 0


def claim_lines(cells: dict[tuple[str, str], list[dict]], planned: dict[tuple[str, str], int]) -> list[str]:
    """Per mechanism (a row's first word) and column: Upcycled's row ("Upc-") against the vanilla one."""
    out, holds, incomplete = ["Claim: Upcycled has the lower epsilon and the better final accuracy", ""], [], []
    for (row, column), runs in cells.items():
        if "Upc-" in row:
            continue
        upc = next((r for r, c in cells if c == column and "Upc-" in r and r.split()[0] == row.split()[0]), None)
        if upc is None:
            continue
        pair = {"vanilla": (row, column), "upcycled": (upc, column)}
        finite = {k: [r["accuracy"] for r in cells[key] if math.isfinite(r["accuracy"])] for k, key in pair.items()}
        label = f"{row.split()[0]} {column}"
        if any(len(finite[k]) < planned[key] for k, key in pair.items()):
            incomplete.append(label)
            counts = ", ".join(f"{k} {len(finite[k])}/{planned[key]} seeds" for k, key in pair.items())
            out.append(f"- {label}: incomplete ({counts})")
            continue
        eps = {k: _mean([r["rdp_mean"] for r in cells[key]]) for k, key in pair.items()}
        acc = {k: _mean(finite[k]) for k in pair}
        ok = eps["upcycled"] < eps["vanilla"] and acc["upcycled"] > acc["vanilla"]
        holds += [label] if ok else []
        out.append(f"- {label}: epsilon {eps['vanilla']:.3f} -> {eps['upcycled']:.3f}, accuracy "
                   f"{100 * acc['vanilla']:.2f} -> {100 * acc['upcycled']:.2f} %: {'holds' if ok else 'MISSES'}")
    total = sum(1 for row, _ in cells if "Upc-" not in row)
    out += ["", f"holds in {len(holds)}/{total} columns" + (f" ({len(incomplete)} incomplete)" if incomplete else ""),
            json.dumps({"suite": "upcycled-privacy", "lower_epsilon_and_better_accuracy": f"{len(holds)}/{total}",
                        "incomplete": len(incomplete)})]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
