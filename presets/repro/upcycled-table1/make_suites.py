"""Write the Upcycled-FL suite files (run after editing the tables below; the TOMLs are what runs).

    python presets/repro/upcycled-table1/make_suites.py

Writes presets/repro/upcycled-table1/suite.toml (Table 1: 90% stragglers),
presets/repro/upcycled-table3/suite.toml (Table 3: 30% stragglers) and
presets/repro/upcycled-privacy/suite.toml (output and objective perturbation).
Hyperparameters and how they were chosen: docs/upcycled-hyperparameters.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # presets/repro: the shared TOML helper
from suite_toml import inline, toml_value  # noqa: E402

REPRO = Path(__file__).resolve().parents[1]

COLUMNS = {  # column label -> dataset
    "Syn(iid)": "syn-iid",
    "Syn(0,0)": "syn-0-0",
    "Syn(0.5,0.5)": "syn-0.5-0.5",
    "Syn(1,1)": "syn-1-1",
}
BASES = {  # row label -> strategy
    "FedAvg": "fedavg", "FedAvgM": "fedavgm", "FedProx": "fedprox", "Scaffold": "scaffold",
    "FedDyn": "feddyn", "pFedMe": "pfedme", "FedYogi": "fedyogi",
}

# (lr, theta) per base and column. "authors": the lr/theta of the authors' code comments (digest Sec. 4,
# non-private); "transfer": FedAvg's authors' values for that column (the authors give none for this base);
# "search": chosen by the search in docs/upcycled-hyperparameters.md.
AUTHORS = {
    "fedavg": {"Syn(iid)": (1e-1, 0.9), "Syn(0.5,0.5)": (5e-3, 0.7), "Syn(0,0)": (1e-1, 0.3), "Syn(1,1)": (5e-3, 0.9)},
    "fedavgm": {"Syn(iid)": (1e-1, 0.5), "Syn(0.5,0.5)": (5e-3, 0.5), "Syn(0,0)": (1e-2, 0.5), "Syn(1,1)": (5e-3, 0.3)},
    "feddyn": {"Syn(iid)": (1e-1, 0.9), "Syn(0.5,0.5)": (5e-3, 0.9), "Syn(0,0)": (5e-3, 0.3), "Syn(1,1)": (1e-3, 0.7)},
}
# The base preset (presets/upcycled-syn.toml) is an Upcycled run: every vanilla cell sets upcycled = false.
# Bases without authors' values: FedAvg's values, with the changes the search made (see the docs).
OVERRIDES: dict[tuple[str, str], tuple[float, float, str]] = {
    # pFedMe needs lr * lambda < 1 (lambda = 15): lr 0.1 diverges; 0.05 is the largest grid value below 1/15.
    ("pfedme", "Syn(iid)"): (5e-2, 0.9, "lr capped: lr*lambda < 1"),
    ("pfedme", "Syn(0,0)"): (5e-2, 0.3, "lr capped: lr*lambda < 1"),
}


def hyperparameters(strategy: str, column: str) -> tuple[float, float, str]:
    if (strategy, column) in OVERRIDES:
        return OVERRIDES[(strategy, column)]
    if strategy in AUTHORS:
        lr, theta = AUTHORS[strategy][column]
        return lr, theta, "authors"
    lr, theta = AUTHORS["fedavg"][column]
    return lr, theta, "transfer from FedAvg (authors)"


# Paper numbers (digest Sec. 4), columns Syn(iid), Syn(0,0), Syn(.5,.5), Syn(1,1): (mean, std) per row.
TABLE1 = {
    "FedAvg": [(98.06, .07), (79.28, .61), (81.58, .43), (80.40, 1.28)],
    "Upc-FedAvg": [(98.83, .29), (81.46, .48), (82.89, .17), (81.49, .53)],
    "FedAvgM": [(98.43, .07), (80.29, .83), (82.60, .37), (80.59, 1.28)],
    "Upc-FedAvgM": [(98.72, .47), (81.74, .42), (83.13, .12), (81.37, .82)],
    "FedProx": [(96.52, .07), (80.72, .77), (81.99, .55), (81.19, .19)],
    "Upc-FedProx": [(97.62, .32), (80.88, .97), (83.10, .83), (81.94, .57)],
    "Scaffold": [(97.51, .24), (80.26, 1.54), (82.44, 1.66), (74.91, 2.67)],
    "Upc-Scaffold": [(98.68, .12), (81.10, .57), (82.64, 1.39), (76.14, 1.28)],
    "FedDyn": [(97.00, .19), (81.62, .97), (80.64, .81), (77.27, 2.95)],
    "Upc-FedDyn": [(98.32, .08), (82.41, 1.04), (82.89, .80), (80.03, 3.02)],
    "pFedMe": [(96.30, .14), (89.15, .24), (89.43, .67), (93.06, .27)],
    "Upc-pFedMe": [(96.77, .12), (89.08, .22), (89.55, .62), (93.12, .23)],
    "FedYogi": [(99.30, .35), (81.20, 2.64), (79.49, 1.30), (78.95, 1.98)],
    "Upc-FedYogi": [(99.41, .32), (81.65, 2.44), (80.84, 1.30), (80.17, .84)],
}
TABLE3 = {
    "FedAvg": [(98.50, .18), (80.30, 1.01), (82.60, .72), (78.81, 2.10)],
    "Upc-FedAvg": [(99.30, .25), (80.77, 1.09), (83.09, .14), (80.74, 2.71)],
    "FedAvgM": [(98.50, .07), (81.08, 2.33), (82.89, .12), (80.64, 2.64)],
    "Upc-FedAvgM": [(99.12, .17), (82.20, 1.80), (82.68, .19), (80.43, 2.51)],
    "FedProx": [(97.22, .24), (80.88, .67), (82.31, 1.05), (80.13, 2.76)],
    "Upc-FedProx": [(98.24, .21), (81.52, .82), (83.05, .14), (81.73, .84)],
    "Scaffold": [(98.28, .14), (79.95, 1.67), (79.54, .72), (72.27, 4.68)],
    "Upc-Scaffold": [(99.52, .18), (79.46, 1.62), (81.83, 2.08), (73.34, 1.13)],
    "FedDyn": [(98.17, .08), (82.06, .61), (80.97, 1.04), (78.65, 3.83)],
    "Upc-FedDyn": [(98.57, .22), (82.08, .68), (82.80, 1.42), (81.11, 2.64)],
    "pFedMe": [(96.45, .14), (91.05, .60), (89.64, 1.04), (92.88, .67)],
    "Upc-pFedMe": [(96.89, .27), (91.06, .61), (89.40, 1.13), (92.64, .90)],
    "FedYogi": [(99.38, .28), (81.06, 2.53), (80.65, 1.32), (79.14, 1.63)],
    "Upc-FedYogi": [(99.60, .14), (81.77, 2.06), (81.72, 1.02), (80.32, .76)],
}
PAPER_COLUMN_ORDER = ["Syn(iid)", "Syn(0,0)", "Syn(0.5,0.5)", "Syn(1,1)"]



def cell(row: str, column: str, overrides: dict, paper=None, note: str = "") -> str:
    lines = ["[[cell]]", f"row = {toml_value(row)}", f"column = {toml_value(column)}",
             f"overrides = {inline(overrides)}"]
    if paper is not None:
        lines += [f"paper = {paper[0]}", f"paper-std = {paper[1]}"]
    if note:
        lines.append(f"note = {toml_value(note)}")
    return "\n".join(lines) + "\n"


def table_suite(name: str, stragglers: float, paper: dict, table: str) -> str:
    rows = [r for b in BASES for r in (b, f"Upc-{b}")]
    head = f'''# Upcycled-FL {table} ({int(stragglers * 100)}% stragglers), the four Synthetic columns. Generated by
# presets/repro/upcycled-table1/make_suites.py; hyperparameters: docs/upcycled-hyperparameters.md.
# 7 bases x {{vanilla 80 rounds, Upcycled 160 rounds}} x 4 columns x 4 seeds = 224 runs.
#   PRIVFED_DATA_DIR=/path/to/data privfed repro {name} --jobs 2

[suite]
name = "{name}"
description = "Upcycled-FL (Yin et al., TMLR 2024) {table}: test accuracy (%) of the global model on the pooled test set after vanilla 80 rounds vs Upcycled 160 rounds (the same 80 training rounds; even rounds contact no client); 30% of 30 clients per round, {int(stragglers * 100)}% stragglers, E = 10, batch 32, SGD momentum 0.5. pFedMe: global-model accuracy (the paper reports the personalised models; see train_personal_accuracy in metrics.jsonl)."
source = "Upcycled-FL, {table} (Syn columns)"
seeds = [1, 2, 3, 4]
base = "../../upcycled-syn.toml"
metric = "final-accuracy"
scale = 100.0
rows = [{", ".join(toml_value(r) for r in rows)}]
columns = [{", ".join(toml_value(c) for c in PAPER_COLUMN_ORDER)}]

[suite.overrides]
stragglers = {stragglers}

'''
    cells = []
    for column in PAPER_COLUMN_ORDER:
        ci = PAPER_COLUMN_ORDER.index(column)
        for row, strategy in BASES.items():
            lr, theta, source = hyperparameters(strategy, column)
            common = {"strategy": strategy, "dataset": COLUMNS[column], "lr": lr}
            note = f"lr {lr:g}, theta {theta:g} ({source})"
            cells.append(cell(row, column, {**common, "num-rounds": 80, "upcycled": False}, paper[row][ci]))
            cells.append(cell(f"Upc-{row}", column, {**common, "num-rounds": 160, "upcycled": True,
                                                       "upcycled-theta": theta},
                              paper[f"Upc-{row}"][ci], note))
    return head + "\n".join(cells)


# Privacy (digest Sec. 3, README recipes): all 30 clients every round, no stragglers, 80 total rounds each
# (vanilla: 80 leaking rounds; Upcycled: 40), tau = 10. Output perturbation: FedAvg, sigma 1.0 vs 0.8, the
# authors' lr/theta for output perturbation. Objective perturbation: FedProx mu = 0.5 (Fig. 4), alpha 10 vs 20,
# the authors' lr/theta for objective perturbation.
OUTPUT_HP = {"Syn(iid)": (1e-1, 0.3), "Syn(0.5,0.5)": (7e-2, 0.3), "Syn(0,0)": (3e-2, 0.5), "Syn(1,1)": (1e-2, 0.1)}
OBJECTIVE_HP = {"Syn(iid)": (1e-2, 0.9), "Syn(0.5,0.5)": (1e-3, 0.7), "Syn(0,0)": (1e-3, 0.9), "Syn(1,1)": (1e-3, 0.3)}


def privacy_suite() -> str:
    rows = ["Output FedAvg sigma=1.0", "Output Upc-FedAvg sigma=0.8",
            "Objective FedProx alpha=10", "Objective Upc-FedProx alpha=20"]
    head = f'''# Upcycled-FL private variants on the four Synthetic federations. Generated by
# presets/repro/upcycled-table1/make_suites.py. 80 total rounds for both (Upcycled: 40 leaking rounds),
# all 30 clients every round, no stragglers, tau = 10. Epsilons (RDP, PLD, Thm 6.2 / 6.3 at delta 1e-5)
# beside final loss and accuracy:
#   PRIVFED_DATA_DIR=/path/to/data privfed repro upcycled-privacy --jobs 2
#   python presets/repro/upcycled-privacy/epsilons.py [results/repro/upcycled-privacy]

[suite]
name = "upcycled-privacy"
description = "Upcycled-FL private variants (Sec. 6): output perturbation (FedAvg; clip the model to tau = 10, add N(0, sigma^2 I), sigma 1.0 vanilla vs 0.8 Upcycled) and objective perturbation (FedProx mu = 0.5; linear term <n, w>, p(n) ~ exp(-alpha ||n||), alpha 10 vanilla vs 20 Upcycled); 80 total rounds each (Upcycled: 40 leaking), all 30 clients every round. Final test accuracy (%); the paper gives no table for these (Figs. 3-4 are curves). Epsilon per run: epsilons.md (presets/repro/upcycled-privacy/epsilons.py)."
source = "Upcycled-FL, Sec. 6 / Figs. 3-4 (no numbers: curves only)"
seeds = [1, 2]
base = "../../upcycled-syn.toml"
metric = "final-accuracy"
scale = 100.0
rows = [{", ".join(toml_value(r) for r in rows)}]
columns = [{", ".join(toml_value(c) for c in PAPER_COLUMN_ORDER)}]

[suite.overrides]
fraction-train = 1.0
stragglers = 0.0
num-rounds = 80
output-clip = 10.0
target-delta = 1e-5

'''
    cells = []
    for column in PAPER_COLUMN_ORDER:
        ds = COLUMNS[column]
        lr, theta = OUTPUT_HP[column]
        out = {"strategy": "fedavg", "dataset": ds, "lr": lr, "privacy": "output"}
        note = f"lr {lr:g}, theta {theta:g} (authors, output perturbation)"
        cells.append(cell(rows[0], column, {**out, "output-noise-std": 1.0, "upcycled": False}))
        cells.append(cell(rows[1], column, {**out, "output-noise-std": 0.8, "upcycled": True,
                                            "upcycled-theta": theta}, note=note))
        lr, theta = OBJECTIVE_HP[column]
        obj = {"strategy": "fedprox", "prox-mu": 0.5, "dataset": ds, "lr": lr, "privacy": "objective"}
        note = f"lr {lr:g}, theta {theta:g} (authors, objective perturbation)"
        cells.append(cell(rows[2], column, {**obj, "objective-alpha": 10.0, "upcycled": False}))
        cells.append(cell(rows[3], column, {**obj, "objective-alpha": 20.0, "upcycled": True,
                                            "upcycled-theta": theta}, note=note))
    return head + "\n".join(cells)


def main() -> None:
    out = {
        "upcycled-table1": table_suite("upcycled-table1", 0.9, TABLE1, "Table 1"),
        "upcycled-table3": table_suite("upcycled-table3", 0.3, TABLE3, "Table 3"),
        "upcycled-privacy": privacy_suite(),
    }
    for name, text in out.items():
        folder = REPRO / name
        folder.mkdir(exist_ok=True)
        (folder / "suite.toml").write_text(text)
        print(f"wrote {folder / 'suite.toml'}")


if __name__ == "__main__":
    main()
